"""The Python face on the host: argument conversion, the library's request and option rules,
graphdecode.Error's fields, config parsing, synthetic weights and checkpoint loading. No device.
"""

import json
import pickle
import struct

import pytest

import graphdecode as gd
from conftest import HAVE_GPU

SMALL = gd.ModelConfig.small_test()


def field_of(fn, *args, **kwargs):
    with pytest.raises(gd.Error) as info:
        fn(*args, **kwargs)
    return info.value.field


# ---- the package -------------------------------------------------------------------------------


def test_version_and_device_check():
    assert gd.__version__.count(".") == 2
    assert isinstance(gd.cuda_device_available(), bool)


def test_error_is_a_value_error_with_field_value_and_text():
    e = gd.Error("must be positive", "max_batch", "0", "engine.cpp:17")
    assert isinstance(e, ValueError)
    assert (e.message, e.field, e.value, e.where) == ("must be positive", "max_batch", "0",
                                                      "engine.cpp:17")
    assert str(e) == "graphdecode: must be positive [max_batch = 0] (at engine.cpp:17)"
    back = pickle.loads(pickle.dumps(e))
    assert (back.field, back.value, str(back)) == (e.field, e.value, str(e))


# ---- model configs -----------------------------------------------------------------------------

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_model_config_presets_and_json():
    assert SMALL.family == "llama" and SMALL.num_hidden_layers == 4
    assert -1 in SMALL.layer_windows and any(w >= 0 for w in SMALL.layer_windows)
    big = gd.ModelConfig.llama_1b()
    assert (big.hidden_size, big.vocab_size, big.tie_word_embeddings) == (2048, 128256, True)
    c = gd.ModelConfig.from_json(json.dumps(LLAMA))
    assert (c.vocab_size, c.hidden_size, c.num_key_value_heads, c.head_dim) == (128, 128, 1, 64)
    assert c.layer_windows == [-1, -1] and c.architecture == "LlamaForCausalLM"
    assert "llama" in repr(c)


def test_model_config_errors_name_the_field(tmp_path):
    bad = dict(LLAMA, hidden_act="gelu")
    with pytest.raises(gd.Error) as info:
        gd.ModelConfig.from_json(json.dumps(bad))
    assert info.value.field == "hidden_act" and "gelu" in info.value.value
    assert field_of(gd.ModelConfig.from_json, json.dumps(dict(LLAMA, num_hidden_layers=0)))
    with pytest.raises(gd.Error):
        gd.ModelConfig.from_file(str(tmp_path / "missing.json"))


# ---- weights -----------------------------------------------------------------------------------


def test_synthetic_weights_follow_the_config():
    w = gd.Weights.synthetic(SMALL, seed=3)
    assert w.config.vocab_size == SMALL.vocab_size
    assert "model.embed_tokens.weight" in w.tensor_names
    assert "model.layers.3.mlp.down_proj.weight" in w.tensor_names
    assert w.total_bytes > 0


def write_checkpoint(path, config, skip=()):
    """A bf16 safetensors checkpoint of zeros for `config` (the tensors HF Llama names)."""
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h],
              "lm_head.weight": [v, h]}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
            p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
            p + "mlp.down_proj.weight": [h, inter]})
    header, offset = {}, 0
    for name, shape in shapes.items():
        if name in skip:
            continue
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(offset))


def test_checkpoint_loads_and_mismatches_name_the_tensor(tmp_path):
    write_checkpoint(tmp_path / "ok", LLAMA)
    w = gd.Weights.load(str(tmp_path / "ok"))
    assert w.config.num_hidden_layers == 2 and len(w.tensor_names) == 3 + 2 * 9
    write_checkpoint(tmp_path / "bad", LLAMA, skip={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(gd.Error) as info:
        gd.Weights.load(str(tmp_path / "bad"))
    assert "model.layers.1.mlp.up_proj.weight" in str(info.value)
    with pytest.raises(gd.Error):
        gd.Weights.load(str(tmp_path / "nowhere"))


# ---- requests: Engine.submit's conversions and the scheduler's rules ----------------------------


@pytest.mark.parametrize("kwargs, field", [
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[1, SMALL.vocab_size]), "prompt[1]"),
    (dict(prompt=[1, -1]), "prompt[1]"),
    (dict(prompt="hello"), "prompt"),
    (dict(prompt=b"hi"), "prompt"),
    (dict(prompt=[1.0]), "prompt[0]"),
    (dict(prompt=[True]), "prompt[0]"),
    (dict(prompt=[2**40]), "prompt[0]"),
    (dict(prompt=5), "prompt"),
    (dict(prompt=[1], max_new_tokens=0), "max_new_tokens"),
    (dict(prompt=[1], max_new_tokens=2.5), "max_new_tokens"),
    (dict(prompt=[1] * 10, max_new_tokens=30, max_context=32), "prompt_len + max_new_tokens"),
    (dict(prompt=[1], stop_tokens=[SMALL.vocab_size]), "stop_tokens"),
    (dict(prompt=[1], stop_tokens=["a"]), "stop_tokens[0]"),
    (dict(prompt=[1], temperature=-1.0), "sampling.temperature"),
    (dict(prompt=[1], temperature=float("nan")), "sampling.temperature"),
    (dict(prompt=[1], temperature="hot"), "sampling.temperature"),
    (dict(prompt=[1], top_k=-1), "sampling.top_k"),
    (dict(prompt=[1], top_p=0.0), "sampling.top_p"),
    (dict(prompt=[1], top_p=1.5), "sampling.top_p"),
    (dict(prompt=[1], seed=-1), "sampling.seed"),
    (dict(prompt=[1], speculate="yes"), "speculate"),
])
def test_bad_requests_name_the_field(kwargs, field):
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt")
    with pytest.raises(gd.Error) as info:
        gd.check_request(SMALL, prompt, **kwargs)
    assert info.value.field == field, str(info.value)
    assert info.value.value != "" or field == "prompt"


def test_error_value_is_the_offending_value():
    with pytest.raises(gd.Error) as info:
        gd.check_request(SMALL, [1, 2, 99999])
    assert info.value.field == "prompt[2]" and info.value.value == "99999"
    with pytest.raises(gd.Error) as info:
        gd.check_request(SMALL, [1], top_p=1.5)
    assert info.value.value == "1.5"


def test_good_requests_pass_in_every_form():
    gd.check_request(SMALL, [1, 2, 3], max_new_tokens=8, stop_tokens=[2],
                     sampling=gd.Sampling(temperature=0.7, top_k=40, top_p=0.9, seed=5))
    gd.check_request(SMALL, range(1, 9), max_new_tokens=8, max_context=16)
    gd.check_request(SMALL, (t for t in [1, 2]))
    gd.check_request(SMALL, [1], sampling={"temperature": 0.5}, seed=2**64 - 1)
    assert field_of(gd.check_request, SMALL, [1], sampling={"heat": 1}) == "sampling.heat"
    assert field_of(gd.check_request, SMALL, [1], sampling=0.5) == "sampling"


def test_arrays_cross_without_a_python_call_per_token():
    np = pytest.importorskip("numpy")
    gd.check_request(SMALL, np.array([1, 2, 3], dtype=np.int64))
    gd.check_request(SMALL, np.array([1, 2, 3], dtype=np.int32)[::2])  # strided
    gd.check_request(SMALL, np.array([1, 2, 3], dtype=np.uint16))
    assert field_of(gd.check_request, SMALL, np.array([[1, 2]])) == "prompt"
    assert field_of(gd.check_request, SMALL, np.array([1.0, 2.0])) == "prompt"
    assert field_of(gd.check_request, SMALL, np.array([1, 2**40])) == "prompt[1]"
    assert field_of(gd.check_request, SMALL, np.array([1, SMALL.vocab_size])) == "prompt[1]"


def test_encoder_states_cross_by_dlpack_and_name_their_faults():
    torch = pytest.importorskip("torch")
    cross = gd.ModelConfig.small_cross_test()
    assert cross.num_cross_layers == 2 and cross.extra_input_tokens == 8
    h = cross.hidden_size
    states = torch.randn(17, h).to(torch.bfloat16)
    image = [cross.vocab_size, 5, 6]  # an input id past the text vocabulary (<|image|>)
    gd.check_request("small-cross", image, encoder_states=states, max_encoder_len=64)
    gd.check_request("small-cross", [1, 2], encoder_states=states[:0], max_encoder_len=64)

    def field(model, states, **kw):
        return field_of(gd.check_request, model, [1, 2], encoder_states=states, **kw)

    assert field("small-cross", states.float(), max_encoder_len=64) == "encoder_states"
    assert field("small-cross", states[0], max_encoder_len=64) == "encoder_states"
    assert field("small-cross", states.t(), max_encoder_len=64) == "encoder_states"
    assert field("small-cross", [[1.0] * h], max_encoder_len=64) == "encoder_states"
    assert field("small-cross", states[:, :h - 1], max_encoder_len=64) == "encoder_states"
    assert field("small-cross", torch.zeros(3, h + 8, dtype=torch.bfloat16),
                 max_encoder_len=64) == "encoder.width"
    assert field("small-cross", states, max_encoder_len=16) == "encoder.length"
    assert field(SMALL, states) == "encoder"  # a model without cross layers
    # The first <|image|> position is a prompt position.
    gd.check_request("small-cross", [1, 2] + image, encoder_states=states, max_encoder_len=64,
                     encoder_first_position=2)
    assert field("small-cross", states, max_encoder_len=64,
                 encoder_first_position=2) == "encoder.first_position"
    assert field("small-cross", states, max_encoder_len=64,
                 encoder_first_position="2") == "encoder_first_position"
    assert field_of(gd.check_request, SMALL, image) == "prompt[0]"


# ---- engine options ----------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_batch="32"), "max_batch"),
    (dict(max_context=2**31), "max_context"),
    (dict(use_graphs=1), "use_graphs"),
    (dict(prefix_cache="yes"), "prefix_cache"),
    (dict(pipeline="on"), "pipeline"),
    (dict(max_batchh=4), "max_batchh"),
    (dict(speculative=gd.Speculative(max_draft_tokens=2, proposer="oracle")),
     "speculative.proposer"),
    (dict(speculative=gd.Speculative(max_draft_tokens=2, k_by_batch=[(8,)])),
     "speculative.k_by_batch[0]"),
    (dict(speculative=gd.Speculative(max_draft_tokens=2, k_by_batch=[(8, "2")])),
     "speculative.k_by_batch[0].k"),
    (dict(speculative={"max_drafts": 2}), "speculative.max_drafts"),
])
def test_bad_engine_options_name_the_field(kwargs, field):
    assert field_of(gd.check_engine_options, **kwargs) == field


def test_eagle_heads_load_and_name_their_faults(tmp_path):
    head = gd.EagleHead.synthetic(SMALL, seed=3)
    assert (head.hidden_size, head.vocab_size) == (SMALL.hidden_size, SMALL.vocab_size)
    assert head.fc_bias and not head.input_norm and not head.own_embedding
    assert "fc.weight" in head.tensor_names and "layers.0.mlp.down_proj.weight" in head.tensor_names
    assert field_of(gd.EagleHead.load, str(tmp_path / "missing")) == "path"
    gd.check_engine_options(speculative=gd.Speculative(max_draft_tokens=3, proposer="eagle"))
    assert field_of(gd.Engine, gd.Weights.synthetic(SMALL, seed=1), eagle=42) == "eagle"
    assert head.version == 1 and head.draft_vocab_size == SMALL.vocab_size


def test_eagle3_heads_have_a_draft_vocabulary():
    head = gd.EagleHead.synthetic3(SMALL, seed=3, draft_vocab_size=100)
    assert head.version == 3 and head.draft_vocab_size == 100
    assert head.hidden_size == SMALL.hidden_size and head.vocab_size == SMALL.vocab_size
    assert {"fc.weight", "midlayer.hidden_norm.weight", "lm_head.weight"} <= set(head.tensor_names)
    assert field_of(gd.EagleHead.synthetic3, SMALL, 1, SMALL.vocab_size + 1) == "draft_vocab_size"


def test_good_engine_options_convert():
    gd.check_engine_options(max_encoder_len=1600, cross_pages=400)
    gd.check_engine_options(max_batch=8, max_context=512, use_graphs=False, deterministic=True,
                            prefix_cache=False, pipeline=True,
                            speculative=gd.Speculative(max_draft_tokens=3, proposer="ngram",
                                                       k_by_batch=[(4, 3), (16, 1)]))


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_batch=0), "max_batch"),
    (dict(max_context=1), "max_context"),
    (dict(page_size=0), "page_size"),
    (dict(speculative=gd.Speculative(max_draft_tokens=99)), "speculative.max_draft_tokens"),
])
def test_engine_checks_its_config_before_the_device(kwargs, field):
    # EngineConfig is validated on the host first: the field is named with or without a GPU.
    weights = gd.Weights.synthetic(SMALL, seed=1)
    assert field_of(gd.Engine, weights, **kwargs) == field


def test_engine_needs_weights():
    assert field_of(gd.Engine, "model.safetensors") == "weights"
    assert field_of(gd.Engine.synthetic, "medium") == "model"


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-device path")
def test_engine_without_a_device_raises_instead_of_crashing():
    with pytest.raises(gd.Error):
        gd.Engine.synthetic("small", max_batch=2, max_context=64)
