pub mod common;
pub mod run;
