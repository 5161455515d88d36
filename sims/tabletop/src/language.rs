//! The instructions of the language-conditioned suite `lang-cubes` ([`crate::lang_cubes`]):
//! three cubes coloured red, green and blue, 21 instructions in four families, paraphrase
//! templates, the held-out combinations, and each family's success test and dense score as
//! pure functions of the cubes' poses (unit-tested without physics).
//!
//! | family | instructions | success |
//! |---|---|---|
//! | pick X | 3 | X grasped, its centre >= [`PICK_LIFT`] above its resting height, the others on the table |
//! | stack X on Y | 6 ordered pairs | StackCube-v1's: X on Y (xy within the half-size's xy norm + 5 mm, z 4 cm +- 5 mm), X not grasped, X static |
//! | put X left of Y | 6 | X on the table, not grasped, static, its centre [`BESIDE_ALONG`] (6-14 cm) to Y's left and within [`BESIDE_ACROSS`] (4 cm) of Y across |
//! | put X right of Y | 6 | the same to Y's right |
//!
//! **Left and right** are as seen from the default front camera ([`crate::pixels`]): its
//! image x axis (right) is `forward x up` = (-0.66, 0.75, 0) in the world, closest to world
//! +y, so "right of Y" means towards +y and "left of Y" towards -y (world x is the other
//! horizontal axis). The arm stands at x = -0.615 facing +x, so the camera's right is the
//! robot's left.

use crate::env::GRIPPER_OPEN;
use crate::world::CUBE_HALF;

/// A cube's colour; the state lists the cubes in [`Color::ALL`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Color {
    /// The first cube.
    Red,
    /// The second cube.
    Green,
    /// The third cube.
    Blue,
}

impl Color {
    /// The cubes in state order.
    pub const ALL: [Color; 3] = [Color::Red, Color::Green, Color::Blue];

    /// The word in instructions.
    pub fn name(self) -> &'static str {
        match self {
            Color::Red => "red",
            Color::Green => "green",
            Color::Blue => "blue",
        }
    }

    /// The cube's index in the state and the world.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The cube's drawn colour (RGBA).
    pub fn rgba(self) -> [u8; 4] {
        match self {
            Color::Red => [220, 30, 30, 255],
            Color::Green => [30, 180, 30, 255],
            Color::Blue => [30, 60, 210, 255],
        }
    }
}

/// Which side of the reference cube, as seen from the front camera (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Towards world -y.
    Left,
    /// Towards world +y.
    Right,
}

impl Side {
    /// The sign of the world-y offset towards this side.
    pub fn sign(self) -> f64 {
        match self {
            Side::Left => -1.0,
            Side::Right => 1.0,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Side::Left => "left",
            Side::Right => "right",
        }
    }
}

/// An instruction: a family and the cubes it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Instruction {
    /// Pick X up.
    Pick(Color),
    /// Stack X on Y.
    Stack(Color, Color),
    /// Put X on the table beside Y, on `Side`.
    Beside(Color, Side, Color),
}

use Color::{Blue, Green, Red};
use Instruction::{Beside, Pick, Stack};
use Side::{Left, Right};

/// Every instruction, in the order of the true state's instruction index.
pub const INSTRUCTIONS: [Instruction; 21] = [
    Pick(Red),
    Pick(Green),
    Pick(Blue),
    Stack(Red, Green),
    Stack(Red, Blue),
    Stack(Green, Red),
    Stack(Green, Blue),
    Stack(Blue, Red),
    Stack(Blue, Green),
    Beside(Red, Left, Green),
    Beside(Red, Left, Blue),
    Beside(Green, Left, Red),
    Beside(Green, Left, Blue),
    Beside(Blue, Left, Red),
    Beside(Blue, Left, Green),
    Beside(Red, Right, Green),
    Beside(Red, Right, Blue),
    Beside(Green, Right, Red),
    Beside(Green, Right, Blue),
    Beside(Blue, Right, Red),
    Beside(Blue, Right, Green),
];

/// Combinations never drawn in training (`instructions = "train"`), one per family but the
/// right-of one: every colour and relation in them is seen in training, only not together.
pub const HELD_OUT: [Instruction; 3] = [Pick(Blue), Stack(Blue, Red), Beside(Green, Left, Blue)];

/// Paraphrase templates per family; `{x}` is the named cube's colour, `{y}` the reference's.
const PICK_TEMPLATES: [&str; PARAPHRASES] = [
    "pick up the {x} cube",
    "lift the {x} cube",
    "grab the {x} cube and raise it",
    "raise the {x} cube off the table",
];
const STACK_TEMPLATES: [&str; PARAPHRASES] = [
    "stack the {x} cube on the {y} cube",
    "put the {x} cube on top of the {y} cube",
    "place the {x} cube onto the {y} cube",
    "set the {x} cube on the {y} cube",
];
/// `{side}` is "left" or "right".
const BESIDE_TEMPLATES: [&str; PARAPHRASES] = [
    "place the {x} cube to the {side} of the {y} cube",
    "put the {x} cube {side} of the {y} cube",
    "move the {x} cube to the {side} side of the {y} cube",
    "set the {x} cube down on the {side} of the {y} cube",
];

/// Paraphrases per instruction.
pub const PARAPHRASES: usize = 4;

/// Length of an instruction's one-hot form ([`Instruction::one_hot`]).
pub const GOAL_DIM: usize = 10;

impl Instruction {
    /// The family's name: `pick`, `stack`, `left-of`, `right-of`.
    pub fn family(self) -> &'static str {
        match self {
            Pick(_) => "pick",
            Stack(..) => "stack",
            Beside(_, Left, _) => "left-of",
            Beside(_, Right, _) => "right-of",
        }
    }

    /// The cube the instruction moves.
    pub fn cube(self) -> Color {
        match self {
            Pick(x) | Stack(x, _) | Beside(x, _, _) => x,
        }
    }

    /// The cube it is placed relative to (None for pick).
    pub fn reference(self) -> Option<Color> {
        match self {
            Pick(_) => None,
            Stack(_, y) | Beside(_, _, y) => Some(y),
        }
    }

    /// The short form `[env] instruction` takes: `pick red`, `stack red on green`,
    /// `put red left of green`, `put red right of green`.
    pub fn canonical(self) -> String {
        match self {
            Pick(x) => format!("pick {}", x.name()),
            Stack(x, y) => format!("stack {} on {}", x.name(), y.name()),
            Beside(x, side, y) => format!("put {} {} of {}", x.name(), side.word(), y.name()),
        }
    }

    /// The instruction named by its canonical form ([`Instruction::canonical`]).
    pub fn parse(text: &str) -> Option<Self> {
        let wanted = text.split_whitespace().collect::<Vec<_>>().join(" ");
        INSTRUCTIONS.into_iter().find(|i| i.canonical() == wanted)
    }

    /// Its index in [`INSTRUCTIONS`].
    pub fn index(self) -> usize {
        INSTRUCTIONS
            .iter()
            .position(|&i| i == self)
            .unwrap_or_else(|| unreachable!("INSTRUCTIONS lists every instruction"))
    }

    /// Paraphrase `k` (`0..PARAPHRASES`, wrapping) as the observation's text.
    pub fn text(self, k: usize) -> String {
        let (template, side) = match self {
            Pick(_) => (PICK_TEMPLATES[k % PARAPHRASES], ""),
            Stack(..) => (STACK_TEMPLATES[k % PARAPHRASES], ""),
            Beside(_, side, _) => (BESIDE_TEMPLATES[k % PARAPHRASES], side.word()),
        };
        template
            .replace("{x}", self.cube().name())
            .replace("{y}", self.reference().map_or("", Color::name))
            .replace("{side}", side)
    }

    /// The instruction as [`GOAL_DIM`] numbers (`[env] goal_in_state`): a one-hot of the
    /// family (pick, stack, left-of, right-of), of the moved cube's colour (red, green, blue)
    /// and of the reference's colour (all zero for pick).
    pub fn one_hot(self) -> [f32; GOAL_DIM] {
        let mut v = [0.0; GOAL_DIM];
        let family = match self {
            Pick(_) => 0,
            Stack(..) => 1,
            Beside(_, Left, _) => 2,
            Beside(_, Right, _) => 3,
        };
        v[family] = 1.0;
        v[4 + self.cube().index()] = 1.0;
        if let Some(y) = self.reference() {
            v[7 + y.index()] = 1.0;
        }
        v
    }

    /// The instruction whose [`Instruction::one_hot`] form `v` is (each value within 0.5 of
    /// it), if any.
    pub fn from_one_hot(v: &[f32]) -> Option<Self> {
        INSTRUCTIONS.into_iter().find(|i| {
            v.len() == GOAL_DIM && i.one_hot().iter().zip(v).all(|(a, b)| (a - b).abs() < 0.5)
        })
    }

    /// Whether it is one of the [`HELD_OUT`] combinations.
    pub fn is_held_out(self) -> bool {
        HELD_OUT.contains(&self)
    }
}

/// Which instructions resets draw from (`[env] instructions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstructionSet {
    /// Every instruction but the [`HELD_OUT`] ones (18).
    #[default]
    Train,
    /// Only the [`HELD_OUT`] ones (3).
    HeldOut,
    /// All 21.
    All,
}

impl InstructionSet {
    /// Its instructions, in [`INSTRUCTIONS`] order.
    pub fn members(self) -> Vec<Instruction> {
        INSTRUCTIONS
            .into_iter()
            .filter(|i| match self {
                InstructionSet::Train => !i.is_held_out(),
                InstructionSet::HeldOut => i.is_held_out(),
                InstructionSet::All => true,
            })
            .collect()
    }
}

/// Pick success: the cube's centre at least this far above its resting height (m).
pub const PICK_LIFT: f64 = 0.05;
/// A cube rests on the table while its centre is within this of [`CUBE_HALF`] (m).
pub const ON_TABLE_TOLERANCE: f64 = 0.005;
/// Beside success: the offset from the reference's centre towards the side (m, world y).
pub const BESIDE_ALONG: [f64; 2] = [0.06, 0.14];
/// Beside success: the largest offset across (m, world x).
pub const BESIDE_ACROSS: f64 = 0.04;

/// What the criteria read of one cube.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CubeFacts {
    /// Centre (m).
    pub position: [f64; 3],
    /// Linear speed (m/s).
    pub speed: f64,
    /// Angular speed (rad/s).
    pub spin: f64,
    /// Both fingers press on it ([`crate::world::World::is_grasping`]).
    pub grasped: bool,
}

impl CubeFacts {
    /// StackCube-v1's static test: speed <= 1 cm/s and spin <= 0.5 rad/s.
    pub fn is_static(&self) -> bool {
        self.speed <= 1e-2 && self.spin <= 0.5
    }

    /// Resting on the table (not lifted, not on another cube).
    pub fn on_table(&self) -> bool {
        (self.position[2] - CUBE_HALF).abs() <= ON_TABLE_TOLERANCE
    }
}

/// What the criteria and scores read of the scene.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SceneFacts {
    /// TCP position (m).
    pub tcp: [f64; 3],
    /// Gripper opening (m).
    pub opening: f64,
    /// Norm of the arm's joint speeds (rad/s).
    pub arm_speed: f64,
    /// Red, green, blue.
    pub cubes: [CubeFacts; 3],
}

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt()
}

/// StackCube-v1's placement test: `a` on `b` (xy within the cubes' xy half-diagonal + 5 mm, z
/// offset one cube +- 5 mm).
pub fn on_top(a: [f64; 3], b: [f64; 3]) -> bool {
    (a[0] - b[0]).hypot(a[1] - b[1]) <= (2.0 * CUBE_HALF * CUBE_HALF).sqrt() + 0.005
        && (a[2] - b[2] - 2.0 * CUBE_HALF).abs() <= 0.005
}

/// Whether the centre `x` lies on `side` of the centre `y` as the beside family wants:
/// [`BESIDE_ALONG`] towards the side along world y, within [`BESIDE_ACROSS`] along world x.
pub fn beside(x: [f64; 3], side: Side, y: [f64; 3]) -> bool {
    let along = side.sign() * (x[1] - y[1]);
    (BESIDE_ALONG[0]..=BESIDE_ALONG[1]).contains(&along) && (x[0] - y[0]).abs() <= BESIDE_ACROSS
}

/// The table point the beside family's shaping pulls the cube to: [`BESIDE_TARGET`] beside
/// the reference's centre.
pub fn beside_point(side: Side, y: [f64; 3]) -> [f64; 3] {
    [y[0], y[1] + side.sign() * BESIDE_TARGET, CUBE_HALF]
}

/// The offset of the beside family's target point from the reference (m), the middle of
/// [`BESIDE_ALONG`].
pub const BESIDE_TARGET: f64 = 0.10;

/// Whether `instruction` is accomplished in `scene` (the table in the module docs).
pub fn success(instruction: Instruction, scene: &SceneFacts) -> bool {
    let x = scene.cubes[instruction.cube().index()];
    match instruction {
        Pick(c) => {
            x.grasped
                && x.position[2] >= CUBE_HALF + PICK_LIFT
                && Color::ALL
                    .into_iter()
                    .filter(|&o| o != c)
                    .all(|o| scene.cubes[o.index()].on_table())
        }
        Stack(_, y) => {
            on_top(x.position, scene.cubes[y.index()].position) && x.is_static() && !x.grasped
        }
        Beside(_, side, y) => {
            beside(x.position, side, scene.cubes[y.index()].position)
                && x.on_table()
                && x.is_static()
                && !x.grasped
        }
    }
}

/// The normalised dense score in [0, 1] (1 exactly on success), after ManiSkill's dense
/// rewards with the named cubes:
/// - pick: PickCube-v1's `(reach + grasped (1 + lift) + placed static) / 5` with the goal
///   the success height above the cube (`lift = 1 - tanh(5 d)` of the height still missing);
/// - stack: StackCube-v1's `(2 reach | 4 + place | 6 + (ungrasp + static) / 2) / 8`;
/// - beside: the same reach-grasp-move-place shaping with [`beside_point`] as the goal and
///   "placed" meaning the beside test with the cube on the table.
pub fn score(instruction: Instruction, scene: &SceneFacts) -> f64 {
    if success(instruction, scene) {
        return 1.0;
    }
    let shaped = |d: f64| 1.0 - (5.0 * d).tanh();
    let x = scene.cubes[instruction.cube().index()];
    let reach = shaped(dist(scene.tcp, x.position));
    let place_stage = |goal: [f64; 3], placed: bool| {
        let mut r = 2.0 * reach;
        if x.grasped {
            r = 4.0 + shaped(dist(x.position, goal));
        }
        if placed {
            let ungrasp = if x.grasped {
                scene.opening / (2.0 * GRIPPER_OPEN)
            } else {
                1.0
            };
            let still = 1.0 - (x.speed * 10.0 + x.spin).tanh();
            r = 6.0 + (ungrasp + still) / 2.0;
        }
        r / 8.0
    };
    match instruction {
        Pick(_) => {
            let missing = (CUBE_HALF + PICK_LIFT - x.position[2]).max(0.0);
            let mut r = reach;
            if x.grasped {
                r += 1.0 + shaped(missing);
            }
            if missing == 0.0 {
                r += shaped(scene.arm_speed);
            }
            r / 5.0
        }
        Stack(_, y) => {
            let b = scene.cubes[y.index()].position;
            let goal = [b[0], b[1], b[2] + 2.0 * CUBE_HALF];
            place_stage(goal, on_top(x.position, b))
        }
        Beside(_, side, y) => {
            let b = scene.cubes[y.index()].position;
            place_stage(
                beside_point(side, b),
                beside(x.position, side, b) && x.on_table(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resting(x: f64, y: f64) -> CubeFacts {
        CubeFacts {
            position: [x, y, CUBE_HALF],
            ..CubeFacts::default()
        }
    }

    fn scene(cubes: [CubeFacts; 3]) -> SceneFacts {
        SceneFacts {
            tcp: [0.0, 0.0, 0.3],
            opening: 0.08,
            arm_speed: 0.0,
            cubes,
        }
    }

    #[test]
    fn twenty_one_distinct_instructions_with_their_own_texts() {
        let mut canon: Vec<String> = INSTRUCTIONS.iter().map(|i| i.canonical()).collect();
        canon.sort();
        canon.dedup();
        assert_eq!(canon.len(), 21);
        for (k, i) in INSTRUCTIONS.into_iter().enumerate() {
            assert_eq!(i.index(), k);
            assert_eq!(Instruction::parse(&i.canonical()), Some(i));
            for p in 0..PARAPHRASES {
                let t = i.text(p);
                assert!(t.contains(i.cube().name()) && !t.contains('{'), "{t}");
            }
        }
        assert_eq!(Pick(Red).text(0), "pick up the red cube");
        assert_eq!(
            Beside(Red, Left, Blue).text(0),
            "place the red cube to the left of the blue cube"
        );
        assert_eq!(
            Instruction::parse("  put green   left of blue"),
            HELD_OUT.get(2).copied()
        );
        assert_eq!(Instruction::parse("pick purple"), None);
        assert_eq!(InstructionSet::Train.members().len(), 18);
        assert_eq!(InstructionSet::HeldOut.members(), HELD_OUT.to_vec());
        assert_eq!(InstructionSet::All.members(), INSTRUCTIONS.to_vec());
    }

    #[test]
    fn pick_needs_a_grasped_lifted_cube_and_the_others_down() {
        let mut held = resting(0.0, 0.0);
        held.position[2] = CUBE_HALF + PICK_LIFT + 0.001;
        held.grasped = true;
        let s = scene([held, resting(0.1, 0.1), resting(-0.1, 0.1)]);
        assert!(success(Pick(Red), &s));
        assert!(!success(Pick(Green), &s));
        let mut low = s;
        low.cubes[0].position[2] = CUBE_HALF + PICK_LIFT - 0.002;
        assert!(!success(Pick(Red), &low));
        let mut dropped = s;
        dropped.cubes[0].grasped = false;
        assert!(!success(Pick(Red), &dropped));
        let mut stacked = s;
        stacked.cubes[1].position = [-0.1, 0.1, 3.0 * CUBE_HALF];
        assert!(!success(Pick(Red), &stacked));
        // Held at the TCP 2 mm short of the height: reach 1, grasp 1, lift ~1 of 5.
        low.tcp = low.cubes[0].position;
        let nearly = score(Pick(Red), &low);
        assert!(nearly > 0.55 && nearly < 0.65, "{nearly}");
    }

    #[test]
    fn stack_is_stack_cube_criterion_with_the_named_cubes() {
        let mut top = resting(0.05, 0.0);
        top.position[2] = 3.0 * CUBE_HALF;
        let s = scene([top, resting(0.05, 0.003), resting(-0.1, 0.1)]);
        assert!(success(Stack(Red, Green), &s));
        assert!(!success(Stack(Red, Blue), &s));
        assert!(!success(Stack(Green, Red), &s));
        let mut moving = s;
        moving.cubes[0].speed = 0.05;
        assert!(!success(Stack(Red, Green), &moving));
        assert!(score(Stack(Red, Green), &moving) >= 6.0 / 8.0);
        let mut held = s;
        held.cubes[0].grasped = true;
        assert!(!success(Stack(Red, Green), &held));
    }

    #[test]
    fn beside_wants_the_named_side_within_the_band() {
        let y = resting(0.0, 0.0);
        for (along, ok) in [(0.05, false), (0.07, true), (0.13, true), (0.15, false)] {
            let s = scene([resting(0.01, -along), y, resting(0.2, 0.2)]);
            assert_eq!(success(Beside(Red, Left, Green), &s), ok, "{along}");
            assert!(!success(Beside(Red, Right, Green), &s));
            let s = scene([resting(0.01, along), y, resting(0.2, 0.2)]);
            assert_eq!(success(Beside(Red, Right, Green), &s), ok, "{along}");
        }
        let across = scene([resting(0.045, -0.1), y, resting(0.2, 0.2)]);
        assert!(!success(Beside(Red, Left, Green), &across));
        let mut lifted = scene([resting(0.0, -0.1), y, resting(0.2, 0.2)]);
        lifted.cubes[0].position[2] += 0.01;
        assert!(!success(Beside(Red, Left, Green), &lifted));
        let mut held = scene([resting(0.0, -0.1), y, resting(0.2, 0.2)]);
        held.cubes[0].grasped = true;
        assert!(!success(Beside(Red, Left, Green), &held));
        let far = scene([resting(0.0, 0.2), y, resting(0.2, 0.2)]);
        let score_far = score(Beside(Red, Left, Green), &far);
        assert!((0.0..0.25).contains(&score_far), "{score_far}");
    }
}
