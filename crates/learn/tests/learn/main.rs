//! The learn crate's end-to-end tests, in one test binary: each module would otherwise build its
//! own copy of the generic training code (about a minute of compile time each on 2 cores).

mod grpo;
mod language;
mod resume;
