"""Reads a diffrl dataset folder the way LeRobot v3.0 and Rerun's importer do (pandas and
pyarrow), and checks the layout: info.json fields, column names and types, task lookup by
the "task" index, episode index ranges, stats.json keys. Exits non-zero on any mismatch.

Usage: tools/check_lerobot_layout.sh DATASET_DIR
"""

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main(root):
    root = Path(root)
    info = json.loads((root / "meta/info.json").read_text())
    for key in ["codebase_version", "fps", "features", "total_episodes", "total_frames", "total_tasks",
                "chunks_size", "data_files_size_in_mb", "splits", "data_path", "video_path", "robot_type"]:
        if key not in info:
            fail(f"info.json lacks {key}")
    if info["codebase_version"] != "v3.0":
        fail("codebase_version")
    # Data: LeRobot formats data_path with chunk and file indices.
    data = pq.read_table(root / info["data_path"].format(chunk_index=0, file_index=0))
    for name in ["observation.state", "action", "next.reward", "next.done", "next.success",
                 "episode_index", "frame_index", "timestamp", "index", "task_index"]:
        if name not in data.column_names:
            fail(f"data lacks column {name}")
        feat = info["features"][name]
        col = data.column(name)
        if feat["shape"] != [1]:
            if not pa.types.is_fixed_size_list(col.type) or col.type.list_size != feat["shape"][0]:
                fail(f"{name}: {col.type} does not match shape {feat['shape']}")
    for name in ["episode_index", "frame_index", "index", "task_index"]:
        if data.column(name).type != pa.int64():
            fail(f"{name} is {data.column(name).type}, LeRobot expects int64")
    if data.column("timestamp").type != pa.float32():
        fail("timestamp must be float32")
    if data.num_rows != info["total_frames"]:
        fail("total_frames")
    # Tasks: LeRobot looks tasks up by the "task" index of the pandas frame.
    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    if tasks.index.name != "task" or "task_index" not in tasks.columns:
        fail(f"tasks.parquet reads as index {tasks.index.name!r}, columns {list(tasks.columns)}")
    task = tasks.index[0]
    if tasks.loc[task, "task_index"] != 0:
        fail("task lookup by index")
    if "__index_level_0__" not in pq.read_table(root / "meta/tasks.parquet").column_names:
        fail("rerun's importer reads __index_level_0__")
    # Episodes: index ranges tile the data.
    eps = pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
    for name in ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                 "dataset_from_index", "dataset_to_index"]:
        if name not in eps.columns:
            fail(f"episodes lacks {name}")
    if len(eps) != info["total_episodes"]:
        fail("total_episodes")
    frames = data.to_pandas()
    for _, e in eps.iterrows():
        sl = frames.iloc[e["dataset_from_index"]:e["dataset_to_index"]]
        if len(sl) != e["length"] or (sl["episode_index"] != e["episode_index"]).any():
            fail(f"episode {e['episode_index']} index range")
        if list(sl["frame_index"]) != list(range(e["length"])):
            fail("frame_index")
    stats = json.loads((root / "meta/stats.json").read_text())
    for k in ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"]:
        if k not in stats["observation.state"]:
            fail(f"stats lacks {k}")
    print(f"OK: {root} reads as LeRobot v3.0: {info['total_episodes']} episodes, {info['total_frames']} frames, task {task!r}")


if __name__ == "__main__":
    main(sys.argv[1])
