//! A checkpoint sharded across files with `model.safetensors.index.json` (as `save_pretrained`
//! writes large models) loads and gives transformers' logits.

use std::collections::HashMap;
use std::path::Path;

use lone_core::{Batch, Model};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

#[test]
fn sharded_checkpoint_matches_reference() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures/lfm2_a");
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(3)).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        let views: HashMap<String, TensorView> = chunk
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(&views, None, &tmp.path().join(&file)).unwrap();
        for n in chunk {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let model = Model::load(tmp.path()).unwrap();
    let prompt: Vec<u32> =
        serde_json::from_str(&std::fs::read_to_string(src.join("prompt_ids.json")).unwrap())
            .unwrap();
    let reference = lone_core::npy::read(&src.join("logits.npy")).unwrap();
    let mut cache = model.new_cache();
    let out = model
        .forward(
            &Batch::for_sequence(0, 0, &prompt, true),
            std::slice::from_mut(&mut cache),
        )
        .unwrap();
    let worst = out
        .logits
        .iter()
        .zip(&reference.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "sharded checkpoint logits differ by {worst}");

    // A shard named in the index but missing is a clear error naming the file.
    std::fs::remove_file(tmp.path().join("model-00002-of-00003.safetensors")).unwrap();
    let err = Model::load(tmp.path())
        .err()
        .expect("missing shard must fail")
        .to_string();
    assert!(err.contains("model-00002-of-00003.safetensors"), "{err}");
}
