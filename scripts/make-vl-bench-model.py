#!/usr/bin/env python3
"""A random-weight LFM2-VL-450M shape (SigLIP2 base NaFlex, 12 layers; projector 3072→2560→1024;
LFM2-350M's language model, ../shared/assets/lfm2/config.LFM2-350M.json) in the Hub's layout, for
speed comparisons only (scripts/compare-vision.sh). Needs torch, transformers 5.24, torchvision.

    python scripts/make-vl-bench-model.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reference" / "vision"))
import generate as g  # noqa: E402
from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration, Lfm2VlImageProcessor, Lfm2VlProcessor  # noqa: E402
OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
text = json.load(open(ROOT.parent / "shared" / "assets" / "lfm2" / "config.LFM2-350M.json"))
tok = g.tokenizer(OUT)
text["vocab_size"] = 65536
vision = dict(model_type="siglip2_vision_model", hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, patch_size=16, num_patches=256, vision_use_head=False, layer_norm_eps=1e-6)
cfg = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=tok.convert_tokens_to_ids("<image>"),
                   projector_hidden_size=2560, downsample_factor=2)
torch.manual_seed(0)
with torch.no_grad():
    m = Lfm2VlForConditionalGeneration(cfg).to(torch.bfloat16)
    for p in m.parameters():
        p.normal_(0, 0.02)
m.save_pretrained(str(OUT))
c = json.loads((OUT / "config.json").read_text()); c["text_config"]["architectures"] = ["Lfm2ForCausalLM"]
(OUT / "config.json").write_text(json.dumps(c, indent=2))
from safetensors.torch import load_file, save_file
st = load_file(str(OUT / "model.safetensors"))
st = {k.replace("model.vision_tower.", "model.vision_tower.vision_model."): v for k, v in st.items()}
save_file(st, str(OUT / "model.safetensors"), metadata={"format": "pt"})
Lfm2VlProcessor(image_processor=Lfm2VlImageProcessor(), tokenizer=tok, chat_template=g.CHAT_TEMPLATE).save_pretrained(str(OUT))
print("ok")
