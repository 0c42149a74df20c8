pub mod chat;
pub mod common;
pub mod run;
