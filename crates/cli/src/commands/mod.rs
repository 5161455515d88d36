//! One module per subcommand that is more than a call into a library: argument handling,
//! folders and printing around the shared machinery in the crate's other modules.

pub mod eval;
pub mod pretrain;
