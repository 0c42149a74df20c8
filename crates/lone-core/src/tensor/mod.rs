mod dtype;
pub use dtype::{ggml_type_name, DType};
