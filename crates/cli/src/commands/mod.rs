//! One module per subcommand: argument handling, folders and printing around the shared
//! machinery of the crate's other modules. Some also hold library functions other commands
//! reuse (`demos::generate`, `dagger::round`, `finetune::finetune`, `reward::train_progress`);
//! `diffrl run` is `crate::pipeline`, `plot` and `view` live with their shared drawing and
//! recording code in `crate::plots` and `crate::viz`.

pub mod bench;
pub mod dagger;
pub mod demos;
pub mod drive;
pub mod eval;
pub mod finetune;
pub mod pretrain;
pub mod reward;
pub mod robustness;
pub mod serve;
pub mod sim;
