#!/usr/bin/env python3
"""Generate the LFM3-VL fixture ``tests/reference/fixtures/lfm3_vl/`` for lone's tests.

    PYTHONPATH=<torchvision> python tests/reference/vision/generate_lfm3_vl.py

needs torch, transformers 5.24, torchvision (LFM3-VL's image processor, transformers'
``Qwen2VLImageProcessor``, resizes with it) and Pillow. Deterministic (fixed seeds, CPU, eager
attention, float32).

What it makes
-------------
A tiny random-weight ``Lfm3VlForConditionalGeneration`` saved as transformers saves it
(``config.json``, ``model.safetensors``) with its processor (``preprocessor_config.json``,
``processor_config.json``, ``tokenizer.json`` with the vision tokens added, ``chat_template.jinja``):

* vision tower: patch embedding of 16×16×2 (temporal) patches, RMSNorm, 6 layers (gated 3×3
  depthwise convolutions over the patch grid and bidirectional grouped-query attention with 2D
  rotary positions), hidden 64, 4 heads, 2 key/value heads;
* projector: layer norm per patch, 2×2 merge, 256 → 96 → 64 with GELU;
* language model: LFM3 (the ``lfm3`` text fixture's shape: conv, sliding, full, sliding attention).

The processor is set small (4–24 image tokens per image) so that the images exercise its rules:
upscaling to the minimum, downscaling to the maximum, rounding, and an image already on the grid.
LFM3-VL's own chat template is not public here: the fixture's writes each image as
``<|vision_start|><|image_pad|><|vision_end|>`` (what the processor expects to expand).

``images/*.png`` are the inputs; ``cases/<case>/`` as in the LFM2-VL fixture (generate.py):
``input_ids.json``, ``prompt.txt``, ``grid_thw.json``, ``pixel_values.sha256`` (+ ``.npy`` for
``one``), ``vision.npy`` (the tower's output, patches in merge-block order), ``features.npy``,
``logits.npy``, ``greedy.json``, ``greedy_text.json``.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
OUT = ROOT / "tests" / "reference" / "fixtures" / "lfm3_vl"
SEED = 43


def _sibling(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


VL2 = _sibling("lfm2_vl_generate", HERE / "generate.py")
TEXT = VL2._text_generator()

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2,
                 size={"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24})

# (height, width): small is upscaled, wide rounded, large downscaled, square and exact kept.
IMAGES = {"small": (45, 70), "wide": (40, 200), "large": (300, 150), "square": (128, 128), "exact": (64, 96)}

CASES = {
    "one": (["small"], "What is this?"),
    "two": (["small", "wide"], "Compare them."),
    "large": (["large"], "Describe."),
    "square": (["square"], "Hi"),
    "exact": (["exact"], "And this?"),
}


def tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(VL2.TINY_TOKENIZER / "tokenizer.json"),
                                  bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                          "<|vision_end|>"]})
    return tok


def build(vocab: int, ids: dict):
    import torch
    from transformers import Lfm3VlConfig, Lfm3VlForConditionalGeneration

    text = json.loads((ROOT / "tests" / "reference" / "fixtures" / "lfm3" / "config.json").read_text())
    for k in ("architectures", "dtype", "transformers_version"):
        text.pop(k, None)
    text["vocab_size"] = vocab
    vision = dict(model_type="lfm3_vl_vision", hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, patch_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, conv_kernel_size=3, norm_eps=1e-5,
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    cfg = Lfm3VlConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                       video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                       vision_end_token_id=ids["<|vision_end|>"], projector_hidden_size=96,
                       projector_hidden_act="gelu", projector_bias=True, tie_word_embeddings=True)
    assert cfg.vision_config.layer_types == ["conv", "conv", "full_attention", "conv", "full_attention", "conv"]
    torch.manual_seed(0)
    model = Lfm3VlForConditionalGeneration(cfg).float().eval()
    TEXT.randomize_(model, SEED)
    # randomize_ knows the text models' conv weights by `conv.conv`; the vision tower's 3×3
    # kernels get the same spread.
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "spatial_conv" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def run_case(model, processor, name: str, images, text: str) -> dict:
    import torch

    out = OUT / "cases" / name
    out.mkdir(parents=True)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    enc = processor(images=images, text=prompt, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    pv, grid = enc["pixel_values"].float().contiguous(), enc["image_grid_thw"]
    (out / "pixel_values.sha256").write_text(hashlib.sha256(pv.numpy().tobytes()).hexdigest() + "\n")
    if name == "one":
        VL2.save_np(out / "pixel_values.npy", pv)
    (out / "grid_thw.json").write_text(json.dumps(grid.tolist()) + "\n")
    (out / "input_ids.json").write_text(json.dumps(ids) + "\n")
    (out / "prompt.txt").write_text(prompt)
    image_token_id = model.config.image_token_id

    with torch.no_grad():
        inner = model.model
        vis = inner.vision_tower(pv, grid_thw=grid)
        VL2.save_np(out / "vision.npy", vis.last_hidden_state)
        feats = torch.cat(inner.get_image_features(pv, grid).pooler_output)
        VL2.save_np(out / "features.npy", feats)
        n_img = sum(1 for t in ids if t == image_token_id)
        assert n_img == feats.shape[0], (n_img, feats.shape)

        gen, logits = VL2.greedy_with_features(model, ids, image_token_id, feats)
        full = model(input_ids=torch.tensor([ids]), pixel_values=pv, image_grid_thw=grid, use_cache=False).logits[0]
        assert torch.allclose(full, logits[:len(ids)], atol=1e-5)
    VL2.save_np(out / "logits.npy", logits)
    (out / "greedy.json").write_text(json.dumps(gen) + "\n")
    (out / "greedy_text.json").write_text(json.dumps(processor.tokenizer.decode(gen, skip_special_tokens=True)) + "\n")
    top2 = logits[len(ids) - 1:-1].topk(2, -1).values
    return {"text": text, "prompt_len": len(ids), "image_tokens": n_img, "grid_thw": grid.tolist(),
            "greedy_distinct": len(set(gen)), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min())}


def main() -> None:
    import torch
    import transformers
    from PIL import Image
    from transformers import Lfm3VlProcessor, Qwen2VLImageProcessor, Qwen3VLVideoProcessor

    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "images").mkdir(parents=True)
    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                     "<|vision_end|>"]}
    vocab = -(-len(tok) // 32) * 32
    model = build(vocab, ids)
    model.config._attn_implementation = "eager"
    model.save_pretrained(str(OUT))
    processor = Lfm3VlProcessor(image_processor=Qwen2VLImageProcessor(**PROCESSOR), tokenizer=tok,
                                video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2),
                                chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(OUT))

    ref, processor = VL2.reload(model, OUT)
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor", type(processor.image_processor)

    for name, (h, w) in IMAGES.items():
        VL2.make_image(name, h, w).save(OUT / "images" / f"{name}.png")
    meta = {"token_ids": ids, "vocab_size": vocab, "n_greedy": VL2.N_GREEDY, "processor": PROCESSOR,
            "images": {k: list(v) for k, v in IMAGES.items()}, "cases": {},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    for case, (names, text) in CASES.items():
        imgs = [Image.open(OUT / "images" / f"{n}.png").convert("RGB") for n in names]
        meta["cases"][case] = {"images": names, **run_case(ref, processor, case, imgs, text)}
        print(case, meta["cases"][case])
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
