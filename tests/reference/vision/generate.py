#!/usr/bin/env python3
"""Generate the vision-language fixture ``tests/reference/fixtures/lfm2_vl/`` for lone's tests.

    PYTHONPATH=<torchvision> python tests/reference/vision/generate.py

needs torch, transformers 5.24, torchvision (the LFM2-VL image processor resizes with it) and
Pillow. Everything is deterministic (fixed seeds, CPU, eager attention, float32).

What it makes
-------------
A tiny random-weight ``Lfm2VlForConditionalGeneration`` saved as transformers saves it
(``config.json``, ``model.safetensors``), with its processor (``preprocessor_config.json``,
``processor_config.json``, ``tokenizer.json`` with the image tokens added, ``chat_template.jinja``):

* vision tower: SigLIP2 NaFlex, hidden 32, 2 layers, 2 heads, patch 16, an 8×8 position grid;
* projector: pixel-unshuffle by 2, layer norm, 128 → 48 → 64 with GELU;
* language model: LFM2 (hidden 64, layers conv, conv, attention, conv, attention).

The processor is set small (tile 128 px, 4–16 image tokens per image, 2–4 tiles) so that the
test images exercise every rule: upscaling to the minimum, downscaling, tiling with a
thumbnail, tiling turned off.

``images/*.png`` are the inputs; ``cases/<case>/`` holds, for one chat turn with some images:

* ``input_ids.json``: the prompt after the processor expanded each ``<image>`` and the chat
  template ran; ``greedy.json``: 12 greedy tokens (full forward over inputs_embeds each step),
  ``greedy_text.json`` their text (special tokens skipped);
* ``spatial_shapes.json`` (patch rows × columns of each tile, thumbnail last), ``rows_cols.json``;
* ``pixel_values.sha256``: the digest of the unpadded patches' float32 bytes, tile after tile
  (``pixel_values.npy`` in full for the ``one`` case);
* ``vision.npy``: the vision tower's ``last_hidden_state`` of each tile's patches, concatenated;
* ``features.npy``: the projector's outputs (the embeddings that replace the image tokens);
* ``logits.npy``: one forward pass over prompt + greedy tokens, every row.
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

def _text_generator():
    """tests/reference/generate.py (the text fixtures' generator) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_generate", HERE.parent / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROOT = HERE.parent.parent.parent
OUT = ROOT / "tests" / "reference" / "fixtures" / "lfm2_vl"
TINY_TOKENIZER = ROOT / "tests" / "reference" / "fixtures" / "lfm2_a"
SEED = 41
N_GREEDY = 12
MAX_TILES = 4

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PROCESSOR = dict(
    downsample_factor=2,
    do_image_splitting=True,
    min_tiles=2,
    max_tiles=MAX_TILES,
    use_thumbnail=True,
    min_image_tokens=4,
    max_image_tokens=16,
    encoder_patch_size=16,
    tile_size=128,
    max_pixels_tolerance=2.0,
)

# (height, width) of each test image and how it is drawn.
IMAGES = {"small": (45, 70), "wide": (40, 200), "large": (300, 150), "square": (128, 128)}

# case -> (images in the user turn, text after them, processor overrides)
CASES = {
    "one": (["small"], "What is this?", {}),
    "two": (["small", "wide"], "Compare them.", {}),
    "tiled": (["large"], "Describe.", {}),
    "untiled": (["large"], "Describe.", {"do_image_splitting": False}),
    "square": (["square"], "Hi", {}),
}


def make_image(name: str, h: int, w: int):
    """A smooth picture with some texture (so that resizing has something to average)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(sum(map(ord, name)))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 100 * np.sin(x / 9.0 + y / 23.0)
    g = 127 + 100 * np.cos(y / 7.0 - x / 31.0)
    b = 255 * (x + y) / (h + w)
    img = np.stack([r, g, b], -1) + rng.normal(0, 18, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def tokenizer(out: Path):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(TINY_TOKENIZER / "tokenizer.json"), bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=4096)
    rows = [f"<|img_row_{r}_col_{c}|>" for r in range(1, MAX_TILES + 1) for c in range(1, MAX_TILES + 1)]
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<|image_start|>", "<|image_end|>",
                                                          "<|img_thumbnail|>", *rows]})
    return tok


def build(vocab: int, image_token_id: int):
    import torch
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    text = dict(model_type="lfm2", vocab_size=vocab, hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, block_auto_adjust_ff_dim=False,
                layer_types=["conv", "conv", "full_attention", "conv", "full_attention"], conv_L_cache=3,
                norm_eps=1e-5, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)
    # 3 layers: llama.cpp's converter maps the projector's linear_1/linear_2 as blocks of the
    # vision tower, so it needs at least 3 of them.
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, patch_size=16, num_patches=64, vision_use_head=False,
                  layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
    cfg = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=image_token_id,
                       projector_hidden_size=48, projector_hidden_act="gelu", downsample_factor=2,
                       projector_bias=True, projector_use_layernorm=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Lfm2VlForConditionalGeneration(cfg).float().eval()
    # The text fixtures' initialisation; the position grid larger (its resizing matters).
    _text_generator().randomize_(model, SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "position_embedding" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def save_np(path: Path, t) -> None:
    import numpy as np

    np.save(str(path), t.detach().cpu().numpy().astype(np.float32))


def reload(model, out: Path):
    """The checkpoint and processor saved in `out`, read back (the references come from what
    the fixture holds), the weights checked against `model`'s."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    ref = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    return ref, AutoProcessor.from_pretrained(str(out))


def greedy_with_features(model, ids: list[int], image_token_id: int, feats):
    """N_GREEDY greedy tokens after `ids` with `feats` in place of the image tokens (a full
    forward over inputs_embeds each step), and the logits of every row of prompt + tokens."""
    import torch

    embed = model.model.get_input_embeddings()
    x = embed(torch.tensor([ids]))
    m = (torch.tensor([ids]) == image_token_id)[..., None]
    x = x.masked_scatter(m, feats)
    gen = []
    for _ in range(N_GREEDY):
        logits = model(inputs_embeds=x, use_cache=False).logits[0]
        t = int(logits[-1].argmax())
        gen.append(t)
        x = torch.cat([x, embed(torch.tensor([[t]]))], 1)
    logits = model(inputs_embeds=x, use_cache=False).logits[0]
    assert [int(v) for v in logits[len(ids) - 1:-1].argmax(-1)] == gen
    return gen, logits


def run_case(model, processor, name: str, images, text: str, overrides: dict) -> dict:
    import torch

    out = OUT / "cases" / name
    out.mkdir(parents=True)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    enc = processor(images=[images], text=prompt, return_tensors="pt", **overrides)
    ids = enc["input_ids"][0].tolist()
    pv, mask, shapes = enc["pixel_values"], enc["pixel_attention_mask"], enc["spatial_shapes"]
    valid = [pv[i][mask[i].bool()] for i in range(pv.shape[0])]
    flat = torch.cat(valid).float().contiguous()
    assert flat.shape[0] == int(shapes.prod(-1).sum())
    (out / "pixel_values.sha256").write_text(hashlib.sha256(flat.numpy().tobytes()).hexdigest() + "\n")
    if name == "one":
        save_np(out / "pixel_values.npy", flat)
    (out / "spatial_shapes.json").write_text(json.dumps(shapes.tolist()) + "\n")
    (out / "input_ids.json").write_text(json.dumps(ids) + "\n")
    (out / "prompt.txt").write_text(prompt)

    with torch.no_grad():
        inner = model.model
        vis = inner.vision_tower(pixel_values=pv, spatial_shapes=shapes, pixel_attention_mask=mask)
        lhs = torch.cat([vis.last_hidden_state[i][mask[i].bool()] for i in range(pv.shape[0])])
        save_np(out / "vision.npy", lhs)
        feats = torch.cat(inner.get_image_features(pv, shapes, mask).pooler_output)
        save_np(out / "features.npy", feats)
        n_img = sum(1 for t in ids if t == model.config.image_token_id)
        assert n_img == feats.shape[0], (n_img, feats.shape)

        gen, logits = greedy_with_features(model, ids, model.config.image_token_id, feats)
        full = model(input_ids=torch.tensor([ids]), pixel_values=pv, spatial_shapes=shapes,
                     pixel_attention_mask=mask, use_cache=False).logits[0]
        assert torch.allclose(full, logits[:len(ids)], atol=1e-5)
    save_np(out / "logits.npy", logits)
    (out / "greedy.json").write_text(json.dumps(gen) + "\n")
    (out / "greedy_text.json").write_text(json.dumps(processor.tokenizer.decode(gen, skip_special_tokens=True)) + "\n")
    top2 = logits[len(ids) - 1:-1].topk(2, -1).values
    return {"text": text, "overrides": overrides, "prompt_len": len(ids),
            "image_tokens": n_img, "tiles": len(valid), "spatial_shapes": shapes.tolist(),
            "greedy_distinct": len(set(gen)), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min())}


LLAMA_CPP = Path.home() / ".cache" / "llama.cpp-0c1e570" / "src"


def convert_ggufs() -> dict:
    """llama.cpp's converter on the checkpoint: the language model and the `mmproj` (vision
    tower + projector), both f32 — the pair llama-mtmd-cli reads. The f32 pair holds the same
    numbers as the checkpoint, so the cases' references apply to it unchanged."""
    import subprocess

    # The language model through the text fixtures' converter run (it knows the fixture
    # tokenizer's pre-tokenizer); the mmproj has no vocabulary.
    text_gen = HERE.parent / "generate.py"
    jobs = json.dumps([["f32", str(OUT / "model-f32.gguf")]])
    subprocess.run([sys.executable, str(text_gen), "--convert", str(OUT), jobs], check=True)
    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "gguf-py")}
    conv = [sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), str(OUT), "--outtype", "f32"]
    subprocess.run([*conv, "--mmproj", "--outfile", str(OUT / "mmproj-f32.gguf")], check=True, env=env)
    return {"text": "model-f32.gguf", "mmproj": "mmproj-f32.gguf", "converter": "llama.cpp 0c1e570"}


def main() -> None:
    import torch
    import transformers
    from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "images").mkdir(parents=True)
    tok = tokenizer(OUT)
    image_token_id = tok.convert_tokens_to_ids("<image>")
    vocab = -(-len(tok) // 32) * 32
    model = build(vocab, image_token_id)
    model.config._attn_implementation = "eager"
    model.save_pretrained(str(OUT))
    # The Hub's LFM2-VL configs name the language model's class in text_config (llama.cpp's
    # converter picks the text model by it); transformers 5 does not write it.
    cfg = json.loads((OUT / "config.json").read_text())
    cfg["text_config"]["architectures"] = ["Lfm2ForCausalLM"]
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # ... and keep the vision tower under `vision_tower.vision_model.` (transformers 5 reads that
    # layout and writes a flatter one; llama.cpp's converter knows only the Hub's).
    from safetensors.torch import load_file, save_file

    st = load_file(str(OUT / "model.safetensors"))
    st = {k.replace("model.vision_tower.", "model.vision_tower.vision_model."): v for k, v in st.items()}
    save_file(st, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    processor = Lfm2VlProcessor(image_processor=Lfm2VlImageProcessor(**PROCESSOR), tokenizer=tok,
                                chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(OUT))

    ref, processor = reload(model, OUT)

    from PIL import Image

    for name, (h, w) in IMAGES.items():
        make_image(name, h, w).save(OUT / "images" / f"{name}.png")
    meta = {"image_token_id": image_token_id, "vocab_size": vocab, "n_greedy": N_GREEDY, "processor": PROCESSOR,
            "images": {k: list(v) for k, v in IMAGES.items()}, "cases": {},
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    for case, (names, text, overrides) in CASES.items():
        imgs = [Image.open(OUT / "images" / f"{n}.png") for n in names]
        meta["cases"][case] = {"images": names, **run_case(ref, processor, case, imgs, text, overrides)}
        print(case, meta["cases"][case])
    meta["gguf"] = convert_ggufs()
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
