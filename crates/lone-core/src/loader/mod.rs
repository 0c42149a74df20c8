//! Model file loaders: GGUF and safetensors, giving named tensors to the model builders.
pub mod gguf;
