//! expert placeholder
#![allow(missing_docs)]
pub struct Expert;
pub struct ExpertConfig;
