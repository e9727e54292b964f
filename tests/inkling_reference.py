"""A NumPy reference forward pass of the Inkling text model, written from the published description
(../shared/notes/inkling.md: hyperparameters, tensor names, the forward pass of one block), not from
any implementation. Float64 throughout; one sequence, all positions at once (causal), so the logits
of position t are what incremental decoding must produce at step t.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def load(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """Weights (numpy order: the reverse of ggml's ne) as float64, and the inkling.* metadata."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    hp: dict[str, object] = {}
    for f in r.fields.values():
        if not f.name.startswith("inkling."):
            continue
        key = f.name[len("inkling."):]
        vals = [f.parts[i].tolist() for i in f.data]
        flat = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in vals]
        hp[key] = flat if len(flat) > 1 or key.endswith("sliding_window_pattern") or key.endswith("head_count_kv") \
            else flat[0]
    w: dict[str, np.ndarray] = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        w[t.name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
    return w, hp


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def short_conv(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Depthwise causal conv with its residual: out_t = u_t + sum_i w[c, i] * u_{t-3+i} (zero before t=0).
    u: [T, C], w: [C, 4] (tap 3 = the current token)."""
    T, _ = u.shape
    k = w.shape[1]
    pad = np.concatenate([np.zeros((k - 1, u.shape[1])), u], axis=0)
    out = u.copy()
    for i in range(k):
        out += w[:, i] * pad[i:i + T]
    return out


def forward(w: dict[str, np.ndarray], hp: dict[str, object], tokens: list[int]) -> np.ndarray:
    """Logits [T, n_vocab] for the token sequence (positions 0..T-1)."""
    eps = float(hp["attention.layer_norm_rms_epsilon"])
    n_layer = int(hp["block_count"])
    H = int(hp["attention.head_count"])
    hkv = hp["attention.head_count_kv"]
    Dh = int(hp["attention.key_length"])
    swa_pat = [bool(v) for v in hp["attention.sliding_window_pattern"]]
    n_swa = int(hp["attention.sliding_window"])
    d_rel = int(hp["d_rel"])
    n_dense = int(hp["dense_block_count"])
    k_used = int(hp["expert_used_count"])
    n_exp = int(hp["expert_count"])
    route_scale = float(hp["expert_weights_scale"])
    floor_n = float(hp["log_scaling_n_floor"])
    alpha = float(hp["log_scaling_alpha"])
    denom = float(hp["logit_scale_denom"])
    n_real = int(hp["unpadded_vocab_size"])

    T = len(tokens)
    pos = np.arange(T)
    x = w["token_embd.weight"][tokens]
    x = _rms(x, eps) * w["token_embd_norm.weight"]
    dist = pos[:, None] - pos[None, :]  # [t, j] = pos_t - pos_j

    for il in range(n_layer):
        p = f"blk.{il}."
        Hkv = int(hkv[il] if isinstance(hkv, list) else hkv)
        is_swa = swa_pat[il]
        h = _rms(x, eps) * w[p + "attn_norm.weight"]
        q = h @ w[p + "attn_q.weight"].T
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T
        r = h @ w[p + "attn_r.weight"].T
        k = short_conv(k, w[p + "shortconv_k.weight"])
        v = short_conv(v, w[p + "shortconv_v.weight"])
        q = _rms(q.reshape(T, H, Dh), eps) * w[p + "attn_q_norm.weight"]
        k = _rms(k.reshape(T, Hkv, Dh), eps) * w[p + "attn_k_norm.weight"]
        v = v.reshape(T, Hkv, Dh)
        tau = np.ones(T) if is_swa else 1.0 + alpha * np.log(np.maximum((pos + 1) / floor_n, 1.0))
        q = q * tau[:, None, None]
        P = w[p + "attn_rel_proj.weight"]  # [d_rel, extent]
        extent = P.shape[1]
        rel = r.reshape(T, H, d_rel) @ P  # [T, H, extent]
        rel = rel * tau[:, None, None]
        in_band = (dist >= 0) & (dist < extent)
        allowed = dist >= 0
        if is_swa:
            allowed &= dist < n_swa
        o = np.zeros((T, H, Dh))
        for hh in range(H):
            kh = hh // (H // Hkv)
            s = (q[:, hh] @ k[:, kh].T) / Dh  # 1/head_dim, not 1/sqrt
            bias = np.where(in_band, np.take_along_axis(rel[:, hh], np.clip(dist, 0, extent - 1), axis=1), 0.0)
            s = np.where(allowed, s + bias, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=1, keepdims=True)
            o[:, hh] = pr @ v[:, kh]
        o = o.reshape(T, H * Dh) @ w[p + "attn_output.weight"].T
        o = short_conv(o, w[p + "shortconv_attn.weight"])
        x = x + o

        h2 = _rms(x, eps) * w[p + "ffn_norm.weight"]
        gscale = float(w[p + "ffn_gscale.weight"].reshape(-1)[0])
        if il < n_dense:
            f = (_silu(h2 @ w[p + "ffn_gate.weight"].T) * (h2 @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            f = f * gscale
        else:
            logits = h2 @ w[p + "ffn_gate_inp.weight"].T  # [T, n_exp + 2]
            sg = _sigmoid(logits)
            sel_score = sg[:, :n_exp] + w[p + "exp_probs_b.bias"]
            f = np.zeros_like(x)
            for t in range(T):
                order = np.argsort(-sel_score[t], kind="stable")  # ties: lowest expert id first
                sel = order[:k_used]
                dsum = sg[t, sel].sum() + sg[t, n_exp] + sg[t, n_exp + 1]
                for e in sel:
                    we = route_scale * gscale * sg[t, e] / dsum
                    a = _silu(w[p + "ffn_gate_exps.weight"][e] @ h2[t]) * (w[p + "ffn_up_exps.weight"][e] @ h2[t])
                    f[t] += we * (w[p + "ffn_down_exps.weight"][e] @ a)
                for sidx in range(2):
                    ws = route_scale * gscale * sg[t, n_exp + sidx] / dsum
                    a = _silu(w[p + "ffn_gate_shexp.weight"][sidx] @ h2[t]) * (w[p + "ffn_up_shexp.weight"][sidx] @ h2[t])
                    f[t] += w[p + "ffn_down_shexp.weight"][sidx] @ (ws * a)
        f = short_conv(f, w[p + "shortconv_mlp.weight"])
        x = x + f

    y = _rms(x, eps) * w["output_norm.weight"] / denom
    out = y @ w["output.weight"].T
    out[:, n_real:] = -math.inf
    return out
