"""Tiny random configs for any architecture of transformers' causal-LM mapping, built offline.

transformers' own tests shrink each model with a hand-written per-model ``ModelTester`` that is not in the wheel,
so the zoo shrinks the architecture's *default* config instead: the config attributes come in families
(hidden/intermediate sizes, layer counts, heads, vocabulary, positions, experts, state-space sizes, sliding
windows, per-layer lists, sub-configs) whose names recur across models; each family gets one small value and the
per-layer lists are rebuilt for the new layer count. What the rules cannot infer is in ``OVERRIDES``: config
values (never model code), each with the reason.
"""

from __future__ import annotations

import copy

# the small value of each family
VALUES = {"hidden": 32, "inter": 64, "heads": 4, "kv_heads": 2, "head_dim": 8, "layers": 2, "vocab": 128,
          "positions": 64, "experts": 4, "top_k": 2, "state": 8}
HIDDEN, LAYERS, HEAD_DIM, POSITIONS = VALUES["hidden"], VALUES["layers"], VALUES["head_dim"], VALUES["positions"]

# name families -> small value; a name in a family is shrunk wherever it appears (sub-configs too)
FAMILIES = {
    "hidden": ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "model_dim", "word_embed_proj_dim",
             "embedding_size", "hidden_dim", "d_embed", "projection_dim", "text_hidden_size", "proj_dim",
               "hidden_size_global", "dim_model", "emb_dim", "hidden_size_per_layer_input", "nemo_conv_channels",
               "ext_pw_out_channel", "depthwise_separable_out_channel", "backbone_hidden_size", "hc_lowrank",
               "ple_embed_dim", "adapter_in_dim", "adapter_input_size", "adapter_out_dim", "embedding_dim",
               "attention_hidden_size"),
    "inter": ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size", "moe_intermediate_size",
            "shared_expert_intermediate_size", "expert_intermediate_size", "decoder_ffn_dim", "encoder_ffn_dim",
            "inner_hidden_size", "mlp_dim", "ffn_size", "intermediate_size_mlp", "dense_intermediate_size",
            "expert_dim", "moe_ffn_hidden_size", "shared_intermediate_size", "d_inner",
            "moe_shared_expert_intermediate_size",
            "ffn_hidden_dim", "mlp_hidden_size", "expert_hidden_size", "dim_ff", "expert_ffn_hidden_size",
            "mamba_d_ssm"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
             "num_decoder_layers", "num_encoder_layers", "num_blocks"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
            "encoder_attention_heads", "attention_heads", "linear_num_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "n_kv_head",
                 "num_query_groups"),
    "head_dim": ("head_dim", "attention_head_size", "d_head", "kv_channels", "head_size", "attention_head_dim",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "dim_head", "linear_head_dim"),
    "vocab": ("vocab_size", "n_vocab", "encoder_hash_byte_group_vocab", "vocab_size_per_layer_input"),
    "positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                "original_max_position_embeddings", "model_max_length"),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts",
              "n_experts", "zero_expert_num"),
    "top_k": ("num_experts_per_tok", "moe_topk", "num_selected_experts", "moe_k", "n_activated_experts",
            "num_experts_per_token", "moe_top_k"),
    "state": ("state_size", "ssm_state_size", "mamba_d_state", "d_state", "mamba_d_head", "mamba_headdim",
            "linear_key_head_dim", "linear_value_head_dim", "kv_lora_rank", "q_lora_rank", "time_step_rank",
            "mamba_dt_rank", "lora_rank", "index_head_dim", "mamba_head_dim"),
}
FAMILY = {name: family for family, names in FAMILIES.items() for name in names}
FAMILY.update({f"swa_{name}": family for name, family in list(FAMILY.items())})  # sliding layers' own sizes
# windows and chunks: small, so a 12-token prompt already crosses them and the windowed paths run; group and
# head counts of routers, linear attention and state-space mixers; sizes of vision/audio towers
SMALL = {"sliding_window": 6, "sliding_window_size": 6, "attention_window": 6, "local_window_size": 6, "chunk_size": 8,
         "attention_chunk_size": 8, "n_group": 1, "topk_group": 1, "num_expert_group": 1, "rotary_dim": 4,
         "num_shared_experts": 1, "n_shared_experts": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "mamba_n_heads": 8, "mamba_num_heads": 8, "mamba_n_groups": 1, "n_groups": 1, "index_n_heads": 2,
         "index_topk": 8,
         "num_nextn_predict_layers": 0, "first_k_dense_replace": 1, "image_size": 32, "patch_size": 8,
         "num_channels": 3, "num_codebooks": 2, "lru_width": HIDDEN, "block_width": HIDDEN, "conv1d_width": 4,
         "conv_kernel": 4, "mamba_d_conv": 4, "linear_conv_kernel_dim": 4,
         # hybrids placing attention (experts) every period layers from an offset: layer 1 of the two
         "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1}
# of SMALL, those a default config may leave None (a checkpoint states them); None stays None for the others
# (a None window means no window)
STATED = ("n_shared_experts", "num_shared_experts", "n_group", "topk_group")
LAYER_LIST_SUFFIXES = ("layer_types", "layers_block_type", "block_types", "layer_type")
INDEX_LIST_KEYS = ("mlp_only_layers", "full_attn_idxs", "attn_layer_indices", "moe_layers", "dense_layers",
                   "global_attn_layers", "no_rope_layers_idx", "swa_layers", "hybrid_layer_ids")

# Values the generic rules cannot infer, keyed by model_type (values only, no model code; merged into the
# shrunk dict, into sub-config dicts too).
OVERRIDES: dict[str, dict] = {
    # the top-level config names no layer count although its cache asks it for one (the decoder's: 2 layers)
    "blt": {"num_hidden_layers": 2},
    # the default config has no attention layer (attn_layer_indices None), which its cache cannot handle
    "bamba": {"attn_layer_indices": [1]},
    # the default config is all Mamba layers (layer_types None), which its cache cannot handle: one attention layer
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # its attention takes the concatenation of two hidden states: 2 * hidden_size wide, heads of 2 * 32 / 4
    "zamba2": {"attention_hidden_size": 64, "attention_head_dim": 16},
    # the chunkwise mLSTM kernel takes whole chunks: 4 divides the 12-token prompt; the config rounds the qk/v
    # widths (hidden * 0.5, hidden * 1) up to multiples of 64 where the model does not: hidden 128 agrees
    "xlstm": {"chunk_size": 4, "hidden_size": 128, "embedding_dim": 128},
    # generate() starts the codebooks' delay pattern from decoder_start_token_id, which only the checkpoints'
    # generation configs state (as the bos id, here moved to 127 by _fix_token_ids)
    "musicgen_decoder": {"decoder_start_token_id": 127},
    "musicgen_melody_decoder": {"decoder_start_token_id": 127},
    # its cache has num_layers_per_stack * H_cycles * (L_cycles + 1) slots, which num_hidden_layers must equal:
    # one layer per stack, one cycle of each: 2
    "hrm_text": {"num_layers_per_stack": 1, "H_cycles": 1, "L_cycles": 1, "L_bp_cycles": [1], "num_hidden_layers": 2},
    # the Mamba-2 mixer's heads must tile expand * hidden_size: 2 * 32 = 8 heads of the head_dim 8
    "mamba2": {"num_heads": 8},
    # the LM-head class asserts a decoder config (its default config is the encoder's)
    # and its axial position embedding must split hidden_size and tile the positions
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [16, 16], "axial_pos_shape": [8, 8]},
    # sliding-window layers have a head of no-rope (per-layer) + rope size: 8 + 8
    "dots3_note_text": {"head_dim": 16},
    # the default config leaves layer_types None (checkpoints state it): one conv and one attention layer
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # the default config has empty rope parameters although every layer is full attention with rope
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # the attention sub-config does not serialize its rope_theta (the model reads it): the default value; and its
    # forward clamps q/k/v by clip_qkv, which the default leaves None: 8, the released checkpoints' value
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # the QSA indexer sizes are None by default although the default layer types use it: all five are required
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 8,
                       "indexer_compress_ratio": 2},
    # two of the shared transformer's hybrid layers (their weights are tied to each other) need four layers
    # (its attention takes the concatenation of two hidden states: 2 * hidden_size wide, heads of 2 * 32 / 4)
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
              "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "attention_hidden_size": 64,
              "attention_head_dim": 16},
    # the language adapters need a language for inputs without lang_ids: its only default language
    "xmod": {"default_language": "en_XX"},
}


def _family_value(family: str, value: int, layers: int) -> int:
    if family == "layers":
        return layers
    if family == "top_k" and value is not None:  # some models allow one expert per token only
        return min(value, VALUES[family])
    return VALUES[family]


def _is_subconfig(key: str, value) -> bool:
    return isinstance(value, dict) and ("model_type" in value or key.endswith("_config"))


def _shrink_per_layer(value: dict, n: int) -> dict:
    """Per-layer overrides keyed by layer index: those that still exist; if none does, the first one moves to the
    last layer (the rebuilt layer lists put a model's rarer kind of layer last)."""
    width = max(len(str(k)) for k in value) if value else 1
    kept = {k: v for k, v in value.items() if int(k) < n}
    if not kept and value:
        kept = {str(n - 1).zfill(width): next(iter(value.values()))}
    return {k: shrink_dict(v) if isinstance(v, dict) else v for k, v in kept.items()}


def _layer_count(d: dict) -> int | None:
    for name in FAMILIES["layers"]:
        if isinstance(d.get(name), int):
            return d[name]
    return None


def _distinct(seq: list) -> list:
    out = []
    for x in seq:
        if x not in out:
            out.append(x)
    return out


def _layers_needed(d: dict, old: int | None) -> int:
    """LAYERS, or more when a per-layer type list has more distinct kinds (each kind must appear once)."""
    kinds = 0
    for key, value in d.items():
        if key.endswith(LAYER_LIST_SUFFIXES) and isinstance(value, list) and value and isinstance(value[0], str):
            kinds = max(kinds, len(_distinct(value)))
    n = max(LAYERS, min(kinds, 4))
    if d.get("num_kv_shared_layers"):  # the last layers reuse the KV of an earlier layer of their kind: twice over
        n = 2 * max(kinds, 1)
    return n


def _rebuild_layer_list(value: list, old: int | None, n: int) -> list:
    """A per-layer list for ``n`` layers: its distinct kinds first (in order of appearance), then cycled."""
    if value and isinstance(value[0], str):
        kinds = _distinct(value)
        return [kinds[i % len(kinds)] for i in range(n)]
    return [value[i % len(value)] for i in range(n)]  # per-layer numbers: the first ones


def _shrink_list(key: str, value: list, old: int | None, n: int):
    if key.startswith("mtp_"):  # multi-token-prediction layers are counted apart from the main stack
        return value
    if key.endswith(LAYER_LIST_SUFFIXES) or (old and len(value) == old and key not in INDEX_LIST_KEYS):
        return _rebuild_layer_list(value, old, n)
    if key in INDEX_LIST_KEYS and all(isinstance(i, int) for i in value):
        kept = [i for i in value if i < n]
        return kept or ([n - 1] if value else [])
    return value


def _shrink_rope(rope, head_dim: int):
    """Rope parameters: lists of per-frequency factors follow the new head size; mrope sections split it."""
    if not isinstance(rope, dict):
        return rope
    if rope and all(isinstance(v, dict) for v in rope.values()):  # per-layer-type rope parameters
        return {k: _shrink_rope(v, head_dim) for k, v in rope.items()}
    out = dict(rope)
    for key, value in rope.items():
        if key in ("short_factor", "long_factor") and isinstance(value, list):
            out[key] = [value[i % len(value)] for i in range(head_dim // 2)]
        elif key in ("mrope_section",) and isinstance(value, list):
            out[key] = _split(head_dim // 2, len(value))
        elif key == "original_max_position_embeddings":
            out[key] = POSITIONS // 2
    return out


def _split(total: int, parts: int) -> list[int]:
    base = [total // parts] * parts
    base[0] += total - sum(base)
    return base


def shrink_dict(d: dict) -> dict:
    """The config dict ``d`` with every known size family made tiny (recursively into sub-configs)."""
    original, d = d, copy.deepcopy(d)
    old = _layer_count(d)
    n = _layers_needed(d, old)
    for key, value in list(d.items()):
        if key == "per_layer_config" and isinstance(value, dict):
            d[key] = _shrink_per_layer(value, n)
        elif _is_subconfig(key, value):
            d[key] = shrink_dict(value)
        elif key in FAMILY and (value is None or isinstance(value, int) and not isinstance(value, bool)):
            # None: the default config leaves it to a checkpoint; the tiny model states it
            d[key] = _family_value(FAMILY[key], value, n)
        elif key in FAMILY and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            d[key] = [_family_value(FAMILY[key], v, n) for v in _rebuild_layer_list(value, old, n)]  # per layer
        elif key.endswith("vocab_size") and isinstance(value, int):  # extra embedding tables (shape, pronunciation)
            d[key] = VALUES["vocab"]
        elif key in SMALL and (isinstance(value, int) and not isinstance(value, bool) or value is None
                               and key in STATED):
            d[key] = SMALL[key]
        elif isinstance(value, list) and key != "architectures":
            d[key] = _shrink_list(key, value, old, n)
        elif isinstance(value, float) and any(w in key for w in ("dropout", "pdrop", "layerdrop")):
            d[key] = 0.0  # no effect in eval mode; makes a train-mode backward deterministic
    if d.get("num_kv_shared_layers"):
        d["num_kv_shared_layers"] = n // 2
    _keep_derived(d, original)
    if "rope_parameters" in d:
        d["rope_parameters"] = _shrink_rope(d["rope_parameters"], d.get("head_dim") or HEAD_DIM)
    _fix_token_ids(d)
    _merge(d, OVERRIDES.get(d.get("model_type"), {}))
    return d


def _merge(d: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(d.get(key), dict) and "rope" not in key:
            _merge(d[key], value)
        else:
            d[key] = value


def _keep_derived(d: dict, original: dict) -> None:
    """Sizes defined by others stay so: multi-head (kv heads == heads) and multi-query (one kv head) attention
    keep their kind, an MLA query head is its no-rope part plus its rope part."""
    for kv in FAMILIES["kv_heads"]:
        heads = next((h for h in FAMILIES["heads"] if isinstance(original.get(h), int)), None)
        if isinstance(original.get(kv), int) and heads:
            if original[kv] == original[heads]:
                d[kv] = d[heads]
            elif original[kv] == 1:
                d[kv] = 1
    if isinstance(d.get("qk_nope_head_dim"), int) and isinstance(d.get("qk_rope_head_dim"), int):
        qk = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        if "qk_head_dim" in d:
            d["qk_head_dim"] = qk
        if original.get("head_dim") == original["qk_nope_head_dim"] + original["qk_rope_head_dim"]:
            d["head_dim"] = qk


def _fix_token_ids(d: dict) -> None:
    """Special token ids beyond the small vocabulary are moved to its top ids (distinct, stable)."""
    vocab = d.get("vocab_size")
    if not isinstance(vocab, int):
        return
    taken = vocab - 1
    for key in sorted(d):
        value = d[key]
        if not key.endswith(("_token_id", "_token_index", "_token_ids", "_id")) or key.endswith("model_id"):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
            d[key], taken = taken, taken - 1
        elif isinstance(value, list) and all(isinstance(v, int) for v in value):
            new = []
            for v in value:
                if v >= vocab:
                    v, taken = taken, taken - 1
                new.append(v)
            d[key] = new


def tiny_config(model_type: str):
    """The default config of ``model_type`` shrunk to a tiny one (raises what the config class raises)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    small = shrink_dict(cls().to_dict())
    small.pop("model_type", None)
    small.pop("transformers_version", None)
    return cls(**small)


def special_token_ids(config) -> set[int]:
    """Every special token id a config names (prompts avoid them: an image token would want an image)."""
    ids: set[int] = set()
    for cfg in [config, *[getattr(config, k) for k in getattr(config, "sub_configs", {}) or {}]]:
        if cfg is None:
            continue
        for key, value in cfg.to_dict().items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                ids.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
    return ids
