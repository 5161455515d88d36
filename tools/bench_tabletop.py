"""Times MuJoCo control steps of the pick-cube scene on one thread, with the same per-step work
as `diffrl bench pick-cube`: the peer half of tools/bench_tabletop.sh.

One control step (20 Hz at the defaults) = read the state (arm joints, fingers, end-effector and
cube poses), damped-least-squares IK for the commanded end-effector move (a 6-D task: the
position moves, the orientation is held at the home pose's), set the 9 position actuators'
targets, then `mj_step` SUBSTEPS times. Every 50 control steps the scene resets: arm at the
Panda's ready pose, fingers open, cube at a seeded random spot in [-0.1, 0.1]^2 around
(0.5, 0) in front of the arm.

Workloads: random = end-effector deltas and gripper commands uniform in [-1, 1] (x 2.5 cm per
step); expert-like = a crude scripted pick (over the cube, down, close, lift), so the fingers
and the cube touch. The model is tools/mujoco_tabletop/pick_cube.xml.

Prints one JSON line: {"impl": "mujoco", ..., "steps_per_s", "mj_steps_per_s"}, where
mj_steps_per_s counts only the time inside mj_step. With --render SIZE it instead times the
random workload with an offscreen SIZE x SIZE RGB frame from the fixed camera after every
control step, and prints {"impl": "mujoco", "what": "render", "size", "frames_per_s" (time in
the render alone), "steps_per_s" (control steps with a frame each)}, or an "error" when no
headless GL works (MUJOCO_GL=egl by default; osmesa if set).

Usage: python tools/bench_tabletop.py --workload random --steps 2000 --substeps 10 [--render 64]
"""

import argparse
import importlib.metadata
import json
import os
import pathlib
import time

import numpy as np

MODEL = pathlib.Path(__file__).resolve().parent / "mujoco_tabletop" / "pick_cube.xml"
# The Panda's "ready" pose (franka_ros), and fully open fingers.
HOME_Q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
FINGER_OPEN = 0.04
EE_STEP = 0.025  # metres per control step at |action| = 1
IK_DAMPING = 0.05  # lambda in dq = J^T (J J^T + lambda^2 I)^-1 e
EPISODE_STEPS = 50
CUBE_HALF = 0.02
CUBE_CENTER = np.array([0.5, 0.0])
CUBE_RANGE = 0.1
# The end-effector target stays in this box, so a random walk cannot drive the arm away.
WORKSPACE_LO = np.array([0.2, -0.4, 0.0])
WORKSPACE_HI = np.array([0.8, 0.4, 0.6])


class PickCube:
    """The scene, its reset and one control step, written as a MuJoCo user would."""

    def __init__(self, mujoco, substeps, dt, seed):
        self.mj = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(MODEL))
        if dt is not None:
            self.model.opt.timestep = dt
        self.data = mujoco.MjData(self.model)
        self.substeps = substeps
        self.rng = np.random.default_rng(seed)
        m = self.model
        arm_joints = [m.joint(f"panda_joint{i}") for i in range(1, 8)]
        self.arm_qpos = np.array([j.qposadr[0] for j in arm_joints])
        self.arm_dofs = np.array([j.dofadr[0] for j in arm_joints])
        self.arm_range = np.array([j.range for j in arm_joints])
        self.finger_qpos = np.array([m.joint(f"panda_finger_joint{i}").qposadr[0] for i in (1, 2)])
        self.cube_qpos = m.joint("cube").qposadr[0]
        self.site = m.site("grasptarget").id
        self.jacp = np.zeros((3, m.nv))
        self.jacr = np.zeros((3, m.nv))
        self.quat = np.zeros(4)
        self.quat_err = np.zeros(4)
        self.rot_err = np.zeros(3)
        self.reset()
        self.home_quat = self.ee_quat().copy()
        self.home_quat_conj = np.zeros(4)
        mujoco.mju_negQuat(self.home_quat_conj, self.home_quat)

    def reset(self):
        m, d = self.model, self.data
        self.mj.mj_resetData(m, d)
        d.qpos[self.arm_qpos] = HOME_Q
        d.qpos[self.finger_qpos] = FINGER_OPEN
        xy = CUBE_CENTER + self.rng.uniform(-CUBE_RANGE, CUBE_RANGE, size=2)
        d.qpos[self.cube_qpos:self.cube_qpos + 7] = [xy[0], xy[1], CUBE_HALF, 1, 0, 0, 0]
        d.ctrl[:7] = HOME_Q
        d.ctrl[7:9] = FINGER_OPEN
        self.mj.mj_forward(m, d)
        self.ee_target = d.site_xpos[self.site].copy()

    def ee_quat(self):
        self.mj.mju_mat2Quat(self.quat, self.data.site_xmat[self.site])
        return self.quat

    def observe(self):
        """The state observation: arm qpos and qvel, fingers, end-effector pose, cube pose."""
        d = self.data
        return np.concatenate([
            d.qpos[self.arm_qpos], d.qvel[self.arm_dofs], d.qpos[self.finger_qpos],
            d.site_xpos[self.site], self.ee_quat(), d.qpos[self.cube_qpos:self.cube_qpos + 7],
        ])

    def ik(self):
        """Damped least squares: dq = J^T (J J^T + lambda^2 I)^-1 [p* - p; rot(q* q^-1)]."""
        mj, m, d = self.mj, self.model, self.data
        mj.mj_jacSite(m, d, self.jacp, self.jacr, self.site)
        jac = np.vstack([self.jacp[:, self.arm_dofs], self.jacr[:, self.arm_dofs]])
        err = np.empty(6)
        err[:3] = self.ee_target - d.site_xpos[self.site]
        # home * current^-1 as a rotation vector, in the world frame like jacr.
        mj.mju_negQuat(self.quat_err, self.ee_quat())
        mj.mju_mulQuat(self.quat_err, self.home_quat, self.quat_err)
        mj.mju_quat2Vel(self.rot_err, self.quat_err, 1.0)
        err[3:] = self.rot_err
        dq = jac.T @ np.linalg.solve(jac @ jac.T + IK_DAMPING**2 * np.eye(6), err)
        q = d.qpos[self.arm_qpos] + dq
        return np.clip(q, self.arm_range[:, 0], self.arm_range[:, 1])

    def step(self, action):
        """One control step; returns the state observation and the seconds spent in mj_step."""
        mj, m, d = self.mj, self.model, self.data
        self.ee_target = np.clip(self.ee_target + EE_STEP * np.clip(action[:3], -1, 1),
                                 WORKSPACE_LO, WORKSPACE_HI)
        d.ctrl[:7] = self.ik()
        d.ctrl[7:9] = FINGER_OPEN * (np.clip(action[3], -1, 1) + 1) / 2
        start = time.perf_counter()
        for _ in range(self.substeps):
            mj.mj_step(m, d)
        physics = time.perf_counter() - start
        return self.observe(), physics


def expert_like_action(obs, t, latched):
    """Over the cube, down, close, lift: a time-phased script on the observed poses."""
    ee, cube = obs[16:19], obs[23:26]
    if t < 20:
        target, grip = cube + [0, 0, 0.08], 1.0
    elif t < 32:
        target, grip = cube, 1.0
    else:
        if "cube" not in latched:
            latched["cube"] = cube.copy()
        lift = 0.15 if t >= 37 else 0.0
        target, grip = latched["cube"] + [0, 0, lift], -1.0
    return np.append(np.clip((target - ee) / EE_STEP, -1, 1), grip)


def run(env, workload, steps, rng, renderer=None):
    """Times `steps` control steps; returns total seconds, seconds in mj_step and in render."""
    obs = env.observe()
    latched = {}
    physics = render = contacts = 0.0
    lifted = 0
    start = time.perf_counter()
    for i in range(steps):
        t = i % EPISODE_STEPS
        if t == 0 and i > 0:
            lifted += int(obs[25] > 0.05)
            env.reset()
            obs = env.observe()
            latched = {}
        if workload == "random":
            action = rng.uniform(-1, 1, size=4)
        else:
            action = expert_like_action(obs, t, latched)
        obs, secs = env.step(action)
        physics += secs
        contacts += env.data.ncon
        if renderer is not None:
            r0 = time.perf_counter()
            renderer.update_scene(env.data, "table_cam")
            renderer.render()
            render += time.perf_counter() - r0
    total = time.perf_counter() - start
    return total, physics, render, contacts / steps, lifted


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["random", "expert-like"], default="random")
    p.add_argument("--steps", type=int, default=2000, help="control steps to time")
    p.add_argument("--substeps", type=int, default=10, help="mj_step calls per control step")
    p.add_argument("--dt", type=float, default=None, help="physics timestep (default: the model's 0.005 s)")
    p.add_argument("--render", type=int, default=None, metavar="SIZE", help="time SIZE x SIZE RGB frames")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.render is None:
        # `import mujoco` loads the MUJOCO_GL backend, which a state benchmark does not need.
        os.environ.pop("MUJOCO_GL", None)
    else:
        # Set before mujoco is imported: it picks its GL backend at import. llvmpipe renders on
        # the calling thread only (LP_NUM_THREADS=0), as the one-core pinning expects.
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("LP_NUM_THREADS", "0")
    head = {"impl": "mujoco", "mujoco": importlib.metadata.version("mujoco"), "task": "pick-cube"}
    render_line = {**head, "what": "render", "obs": "pixels", "workload": a.workload, "size": a.render,
                   "substeps": a.substeps, "steps": a.steps, "gl": os.environ.get("MUJOCO_GL")}
    try:
        import mujoco
    except Exception as e:  # MUJOCO_GL=osmesa without libOSMesa fails here already
        if a.render is None:
            raise
        print(json.dumps({**render_line, "error": f"import mujoco: {type(e).__name__}: {e}"}))
        return

    env = PickCube(mujoco, a.substeps, a.dt, a.seed)
    rng = np.random.default_rng(a.seed + 1)
    if a.render is None:
        total, physics, _, contacts, lifted = run(env, a.workload, a.steps, rng)
        print(json.dumps({**head, "workload": a.workload, "obs": "state", "substeps": a.substeps,
                          "dt": env.model.opt.timestep, "steps": a.steps, "seconds": total,
                          "steps_per_s": a.steps / total, "mj_steps_per_s": a.steps * a.substeps / physics,
                          "mean_contacts": contacts, "episodes_lifted": lifted}))
        return
    line = render_line
    try:
        renderer = mujoco.Renderer(env.model, a.render, a.render)
        renderer.update_scene(env.data, "table_cam")
        renderer.render()
    except Exception as e:  # no headless GL here: say so rather than crash the benchmark
        print(json.dumps({**line, "error": f"{type(e).__name__}: {e}"}))
        return
    total, _, render, _, _ = run(env, a.workload, a.steps, rng, renderer)
    print(json.dumps({**line, "frames_per_s": a.steps / render, "steps_per_s": a.steps / total}))


if __name__ == "__main__":
    main()
