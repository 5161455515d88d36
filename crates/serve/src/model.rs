//! What the server serves: a model that maps a batch of observation windows to action chunks,
//! the description of its inputs and outputs, and the parsing of one request against it.

use std::collections::VecDeque;

use burn::tensor::backend::Backend;
use diffrl_core::seeding::Rng;
use diffrl_policy::{ObsBatch, Policy, SampleMode, Strictness, Tokenizer};
use rmpv::Value;

use crate::error::RequestError;
use crate::msgpack::{self, get, key_text};

/// A model's inputs and outputs, sent to every client on connect.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// A name for logs and metadata (e.g. the checkpoint folder).
    pub name: String,
    /// Observations per policy input (To).
    pub obs_horizon: usize,
    /// Width of `observation.state` (0 = no state input).
    pub state_dim: usize,
    /// `observation.image` geometry [height, width, channels] when the policy sees pixels.
    pub image: Option<[usize; 3]>,
    /// Actions returned per request (Ta: the executed part of the predicted chunk).
    pub action_horizon: usize,
    /// Width of one action.
    pub action_dim: usize,
    /// The instruction tokenizer of a language-conditioned policy: every request must then
    /// carry a `prompt` it accepts (strictly: no word outside the vocabulary). None: prompts are
    /// ignored.
    pub text: Option<Tokenizer>,
    /// Control frequency the policy was trained at (Hz).
    pub fps: f64,
    /// Further facts for the metadata map (chain length, policy kind, ...).
    pub extra: Vec<(String, Value)>,
}

/// A model the server can run. Implementations own their device and weights; the server calls
/// them from one inference thread.
pub trait ActionModel: Send + 'static {
    /// Inputs and outputs.
    fn spec(&self) -> &ModelSpec;
    /// Action chunks `[B, Ta, Da]` (row-major) for a batch of observation windows; row b draws
    /// its sampling noise from `rngs[b]` only, so answers do not depend on batching.
    fn infer(&mut self, obs: &ObsBatch, rngs: &mut [Rng]) -> Result<Vec<f32>, String>;
}

/// A diffrl policy checkpoint as an [`ActionModel`].
pub struct PolicyRunner<B: Backend> {
    policy: Policy<B>,
    device: B::Device,
    mode: SampleMode,
    spec: ModelSpec,
}

impl<B: Backend> PolicyRunner<B> {
    /// Serves `policy` on `device`; `mode` chooses deterministic (DDIM, eval) or stochastic
    /// chains.
    pub fn new(
        policy: Policy<B>,
        device: B::Device,
        mode: SampleMode,
        name: String,
        fps: f64,
    ) -> Self {
        let spec = ModelSpec {
            name,
            obs_horizon: policy.config.obs_horizon,
            state_dim: policy.spec.state_dim,
            image: policy.spec.image.map(|[c, h, w]| [h, w, c]),
            action_horizon: policy.config.action_horizon,
            action_dim: policy.spec.action_dim,
            text: policy.tokenizer().cloned(),
            fps,
            extra: vec![
                (
                    "policy_kind".into(),
                    Value::from(format!("{:?}", policy.config.kind).to_lowercase()),
                ),
                (
                    "pred_horizon".into(),
                    Value::from(policy.config.pred_horizon),
                ),
                ("chain_steps".into(), Value::from(policy.chain_len())),
                (
                    "denoiser".into(),
                    Value::from(format!("{:?}", policy.config.denoiser.kind).to_lowercase()),
                ),
                // Multi-agent policies: `observation.state` stacks one block of
                // state_dim / agents values per agent, and an action one of action_dim /
                // agents values per agent, in agent order.
                ("agents".into(), Value::from(policy.spec.agents)),
                (
                    "entities".into(),
                    Value::Array(
                        policy
                            .spec
                            .entities
                            .iter()
                            .map(|g| {
                                Value::Map(vec![
                                    ("name".into(), Value::from(g.name.as_str())),
                                    ("offset".into(), Value::from(g.offset)),
                                    ("width".into(), Value::from(g.width)),
                                    ("count".into(), Value::from(g.count)),
                                ])
                            })
                            .collect(),
                    ),
                ),
                (
                    "sampling".into(),
                    Value::from(match mode {
                        SampleMode::Deterministic => "deterministic",
                        SampleMode::Stochastic => "stochastic",
                    }),
                ),
            ],
        };
        Self {
            policy,
            device,
            mode,
            spec,
        }
    }
}

impl<B: Backend> ActionModel for PolicyRunner<B>
where
    B::Device: Send,
    Policy<B>: Send,
{
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn infer(&mut self, obs: &ObsBatch, rngs: &mut [Rng]) -> Result<Vec<f32>, String> {
        let act = self
            .policy
            .act_rows(obs, self.mode, rngs, &self.device)
            .map_err(|e| e.to_string())?;
        let [tp, da] = self.policy.chunk();
        let ta = self.spec.action_horizon;
        Ok(act
            .actions
            .chunks(tp * da)
            .flat_map(|chunk| chunk[..ta * da].iter().copied())
            .collect())
    }
}

/// Keys a request may carry. `observation/state` (openpi's spelling) is accepted for
/// `observation.state` (LeRobot's), and likewise for the image.
pub const KNOWN_KEYS: [&str; 5] = [
    "observation.state",
    "observation.image",
    "prompt",
    "seed",
    "reset",
];

/// One parsed request: the newest observation (or a whole window) and options.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// States, `frames` x state_dim.
    pub state: Vec<f32>,
    /// Images, `frames` x H x W x C.
    pub image: Option<Vec<u8>>,
    /// 1 (the newest observation; the server keeps the window) or To (the whole window).
    pub frames: usize,
    /// Language instruction: checked against the vocabulary of a language-conditioned policy
    /// (and required by it), ignored by others.
    pub prompt: Option<String>,
    /// Noise seed for this request (default: derived from the server seed and the request's
    /// index on its connection).
    pub seed: Option<u64>,
    /// Start a new episode: forget this connection's observation window first.
    pub reset: bool,
}

fn lookup<'a>(m: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    get(m, key).or_else(|| get(m, &key.replacen('.', "/", 1)))
}

fn frames_of(
    shape: &[usize],
    item: &[usize],
    to: usize,
    field: &str,
) -> Result<usize, RequestError> {
    let want = |d: &[usize]| {
        d.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(" x ")
    };
    if shape == item {
        return Ok(1);
    }
    if shape.len() == item.len() + 1 && shape[1..] == *item && (shape[0] == to || shape[0] == 1) {
        return Ok(shape[0]);
    }
    Err(RequestError::new(
        field,
        format!(
            "shape {shape:?} does not fit this policy: send [{}] (the newest observation) or [{to} x {}] (the whole window of To = {to})",
            want(item),
            want(item)
        ),
    ))
}

/// Parses a decoded request map against `spec`. Unknown keys are ignored, and listed in the
/// error when a required key is missing.
pub fn parse_request(v: &Value, spec: &ModelSpec) -> Result<Request, RequestError> {
    let Value::Map(m) = v else {
        return Err(RequestError::new(
            "request",
            format!(
                "expected a msgpack map of observations, got {}",
                msgpack::describe(v)
            ),
        ));
    };
    let unknown: Vec<String> = m
        .iter()
        .map(|(k, _)| key_text(k))
        .filter(|k| {
            !KNOWN_KEYS
                .iter()
                .any(|n| *n == k || n.replacen('.', "/", 1) == *k)
        })
        .collect();
    let missing = |key: &str| {
        let mut msg = "required key is missing".to_string();
        if !unknown.is_empty() {
            msg += &format!(" (unknown keys received: {})", unknown.join(", "));
        }
        RequestError::new(key, msg)
    };
    let to = spec.obs_horizon;
    let (mut state, mut frames) = (Vec::new(), None);
    if spec.state_dim > 0 {
        let field = "observation.state";
        let raw = lookup(m, field).ok_or_else(|| missing(field))?;
        let (shape, values) = msgpack::numeric(raw, field)?;
        frames = Some(frames_of(&shape, &[spec.state_dim], to, field)?);
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(RequestError::new(
                field,
                format!("element {i} is {} (observations must be finite)", values[i]),
            ));
        }
        state = values.iter().map(|&x| x as f32).collect();
    }
    let mut image = None;
    if let Some([h, w, c]) = spec.image {
        let field = "observation.image";
        let raw = lookup(m, field).ok_or_else(|| missing(field))?;
        let f = match msgpack::NdArray::from_value(raw, field)? {
            Some(a) if a.dtype == msgpack::DType::Uint(1) => {
                let f = frames_of(&a.shape, &[h, w, c], to, field)?;
                image = Some(a.data);
                f
            }
            Some(a) => {
                return Err(RequestError::new(
                    field,
                    format!(
                        "dtype {} (send uint8 {h} x {w} x {c} pixels)",
                        a.dtype.name()
                    ),
                ));
            }
            None => {
                let (shape, values) = msgpack::numeric(raw, field)?;
                let f = frames_of(&shape, &[h, w, c], to, field)?;
                if values
                    .iter()
                    .any(|&x| !(0.0..=255.0).contains(&x) || x.fract() != 0.0)
                {
                    return Err(RequestError::new(
                        field,
                        "pixels must be integers in 0..=255",
                    ));
                }
                image = Some(values.iter().map(|&x| x as u8).collect());
                f
            }
        };
        if frames.is_some_and(|s| s != f) {
            return Err(RequestError::new(
                field,
                format!(
                    "{f} frames, but observation.state has {}",
                    frames.unwrap_or(0)
                ),
            ));
        }
        frames = Some(f);
    }
    let prompt = match lookup(m, "prompt") {
        None | Some(Value::Nil) => None,
        Some(Value::String(s)) => Some(s.as_str().unwrap_or_default().to_owned()),
        Some(other) => {
            return Err(RequestError::new(
                "prompt",
                format!("expected a string, got {}", msgpack::describe(other)),
            ));
        }
    };
    if let Some(tok) = &spec.text {
        // Checked here, not in the batched policy call, so that one bad prompt fails only its
        // own request.
        let Some(p) = &prompt else {
            return Err(RequestError::new(
                "prompt",
                "required: this policy is language-conditioned; send the task instruction as a \
                 string",
            ));
        };
        tok.encode(p, Strictness::Strict)
            .map_err(|e| RequestError::new("prompt", e.to_string()))?;
    }
    let seed = match lookup(m, "seed") {
        None | Some(Value::Nil) => None,
        Some(s) => {
            let (shape, v) = msgpack::numeric(s, "seed")?;
            match (shape.as_slice(), v.as_slice()) {
                ([], [x]) if *x >= 0.0 && x.fract() == 0.0 && *x < 2f64.powi(64) => Some(match s {
                    Value::Integer(i) => i.as_u64().unwrap_or(*x as u64),
                    _ => *x as u64,
                }),
                _ => return Err(RequestError::new("seed", "expected a non-negative integer")),
            }
        }
    };
    let reset = match lookup(m, "reset") {
        None | Some(Value::Nil) => false,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            return Err(RequestError::new(
                "reset",
                format!("expected a boolean, got {}", msgpack::describe(other)),
            ));
        }
    };
    Ok(Request {
        state,
        image,
        frames: frames.unwrap_or(1),
        prompt,
        seed,
        reset,
    })
}

/// The observation window of one connection: requests that send only the newest observation
/// are stacked here (the first one repeated To times, as in training).
#[derive(Debug, Default)]
pub struct Window {
    frames: VecDeque<(Vec<f32>, Option<Vec<u8>>)>,
}

impl Window {
    /// Adds `req` and returns the policy input ([To x Ds] states, [To x H x W x C] pixels).
    pub fn push(&mut self, req: Request, to: usize) -> (Vec<f32>, Option<Vec<u8>>) {
        if req.reset {
            self.frames.clear();
        }
        if req.frames == to {
            // A whole window: use it as sent, and keep its frames for later single-frame calls.
            self.frames.clear();
            let ds = req.state.len() / to;
            let px = req.image.as_ref().map(|i| i.len() / to);
            for f in 0..to {
                let s = req.state[f * ds..(f + 1) * ds].to_vec();
                let i = req
                    .image
                    .as_ref()
                    .zip(px)
                    .map(|(i, n)| i[f * n..(f + 1) * n].to_vec());
                self.frames.push_back((s, i));
            }
            return (req.state, req.image);
        }
        let frame = (req.state, req.image);
        if self.frames.is_empty() {
            self.frames.extend(std::iter::repeat_n(frame, to));
        } else {
            self.frames.push_back(frame);
            while self.frames.len() > to {
                self.frames.pop_front();
            }
        }
        let state = self
            .frames
            .iter()
            .flat_map(|(s, _)| s.iter().copied())
            .collect();
        let image = self.frames[0].1.is_some().then(|| {
            self.frames
                .iter()
                .flat_map(|(_, i)| i.iter().flatten().copied())
                .collect()
        });
        (state, image)
    }
}

/// The metadata map sent on connect.
pub fn metadata(spec: &ModelSpec, batching: Value) -> Value {
    let s = |x: &str| Value::from(x);
    let shape = |d: &[usize]| Value::Array(d.iter().map(|&x| Value::from(x)).collect());
    let mut obs = Vec::new();
    if spec.state_dim > 0 {
        obs.push((
            s("observation.state"),
            Value::Map(vec![
                (s("shape"), shape(&[spec.obs_horizon, spec.state_dim])),
                (
                    s("accepts"),
                    s("[D] (newest; the server keeps the window) or [To, D]"),
                ),
                (s("dtype"), s("float32")),
            ]),
        ));
    }
    if let Some([h, w, c]) = spec.image {
        obs.push((
            s("observation.image"),
            Value::Map(vec![
                (s("shape"), shape(&[spec.obs_horizon, h, w, c])),
                (s("accepts"), s("[H, W, C] (newest) or [To, H, W, C]")),
                (s("dtype"), s("uint8")),
            ]),
        ));
    }
    if let Some(tok) = &spec.text {
        let words = tok.vocabulary().tokens()[2..]
            .iter()
            .map(|w| s(w))
            .collect();
        obs.push((
            s("prompt"),
            Value::Map(vec![
                (s("dtype"), s("string")),
                (s("required"), Value::Boolean(true)),
                (s("max_words"), Value::from(tok.max_tokens())),
                (s("vocabulary"), Value::Array(words)),
            ]),
        ));
    }
    let mut m = vec![
        (s("server"), s("diffrl")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("policy"), s(&spec.name)),
        (s("fps"), Value::F64(spec.fps)),
        (s("obs_horizon"), Value::from(spec.obs_horizon)),
        (s("action_horizon"), Value::from(spec.action_horizon)),
        (s("action_dim"), Value::from(spec.action_dim)),
        (s("observation"), Value::Map(obs)),
        (
            s("action"),
            Value::Map(vec![
                (s("shape"), shape(&[spec.action_horizon, spec.action_dim])),
                (s("dtype"), s("float32")),
            ]),
        ),
        (
            s("optional_keys"),
            Value::Array(vec![s("prompt"), s("seed"), s("reset")]),
        ),
        (s("batching"), batching),
    ];
    m.extend(spec.extra.iter().map(|(k, v)| (s(k), v.clone())));
    Value::Map(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::NdArray;

    fn spec(image: Option<[usize; 3]>) -> ModelSpec {
        ModelSpec {
            name: "t".into(),
            obs_horizon: 2,
            state_dim: 3,
            image,
            action_horizon: 2,
            action_dim: 2,
            text: None,
            fps: 10.0,
            extra: vec![],
        }
    }

    fn map(entries: Vec<(&str, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        )
    }

    #[test]
    fn single_frames_and_windows_are_accepted() {
        let one = map(vec![(
            "observation.state",
            NdArray::from_f32(&[3], &[1.0, 2.0, 3.0]).to_value(),
        )]);
        let r = parse_request(&one, &spec(None)).unwrap();
        assert_eq!((r.frames, r.state.len()), (1, 3));
        let both = map(vec![(
            "observation/state",
            NdArray::from_f32(&[2, 3], &[0.0; 6]).to_value(),
        )]);
        assert_eq!(parse_request(&both, &spec(None)).unwrap().frames, 2);
        let wrong = map(vec![(
            "observation.state",
            NdArray::from_f32(&[4], &[0.0; 4]).to_value(),
        )]);
        let e = parse_request(&wrong, &spec(None)).unwrap_err().to_string();
        assert!(e.contains("[4]") && e.contains("[3]"), "{e}");
    }

    #[test]
    fn missing_keys_list_the_unknown_ones() {
        let v = map(vec![("state", Value::from(1)), ("extra", Value::from(2))]);
        let e = parse_request(&v, &spec(None)).unwrap_err();
        assert_eq!(e.field, "observation.state");
        assert!(e.message.contains("state, extra"), "{e}");
        // Unknown keys next to the required ones are ignored.
        let ok = map(vec![
            (
                "observation.state",
                NdArray::from_f32(&[3], &[0.0; 3]).to_value(),
            ),
            ("wrist_camera", Value::from(1)),
        ]);
        assert!(parse_request(&ok, &spec(None)).is_ok());
    }

    #[test]
    fn nan_and_bad_options_are_named() {
        let nan = map(vec![(
            "observation.state",
            NdArray::from_f32(&[3], &[0.0, f32::NAN, 1.0]).to_value(),
        )]);
        let e = parse_request(&nan, &spec(None)).unwrap_err().to_string();
        assert!(e.contains("element 1") && e.contains("NaN"), "{e}");
        let state = NdArray::from_f32(&[3], &[0.0; 3]).to_value();
        for (k, v) in [
            ("seed", Value::from(-1)),
            ("reset", Value::from(1)),
            ("prompt", Value::from(3)),
        ] {
            let e = parse_request(
                &map(vec![("observation.state", state.clone()), (k, v)]),
                &spec(None),
            )
            .unwrap_err();
            assert_eq!(e.field, k);
        }
        assert!(parse_request(&Value::from(1), &spec(None)).is_err());
    }

    #[test]
    fn images_must_be_uint8_of_the_right_size() {
        let s = spec(Some([4, 4, 3]));
        let state = NdArray::from_f32(&[3], &[0.0; 3]).to_value();
        let px = NdArray {
            shape: vec![4, 4, 3],
            dtype: msgpack::DType::Uint(1),
            data: vec![7; 48],
        };
        let ok = map(vec![
            ("observation.state", state.clone()),
            ("observation.image", px.to_value()),
        ]);
        assert_eq!(parse_request(&ok, &s).unwrap().image.unwrap().len(), 48);
        let float = NdArray::from_f32(&[4, 4, 3], &[0.5; 48]).to_value();
        let e = parse_request(
            &map(vec![
                ("observation.state", state),
                ("observation.image", float),
            ]),
            &s,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("uint8"), "{e}");
    }

    #[test]
    fn the_window_repeats_the_first_frame_then_slides() {
        let req = |x: f32, reset: bool| Request {
            state: vec![x; 3],
            image: None,
            frames: 1,
            prompt: None,
            seed: None,
            reset,
        };
        let mut w = Window::default();
        assert_eq!(w.push(req(1.0, false), 2).0, vec![1.0; 6]);
        assert_eq!(w.push(req(2.0, false), 2).0, [[1.0; 3], [2.0; 3]].concat());
        assert_eq!(w.push(req(3.0, false), 2).0, [[2.0; 3], [3.0; 3]].concat());
        assert_eq!(w.push(req(4.0, true), 2).0, vec![4.0; 6]);
    }
}
