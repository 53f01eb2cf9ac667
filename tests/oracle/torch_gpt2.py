#!/usr/bin/python3
"""PyTorch oracle for the CPU GPT-2 (DESIGN.md section 7).

A GPT-2 written from the math in plain torch (no transformers), in fp64, loads the initial checkpoint
that oracle_dump wrote (through h5py, so the checkpoint format is checked against section 5, not
against our own reader), runs the same batches and compares with what our C++ model and optimizer
produced:

  logits and loss of step 0, every gradient of step 0 (by Hugging Face name), then `steps` steps of
  torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW: per-step loss and grad norm, the final parameters
  and the final AdamW moments (from the checkpoint oracle_dump saved after the last step).

usage: /usr/bin/python3 torch_gpt2.py CASE_DIR [CASE_DIR ...]
   each CASE_DIR holds init.h5, ours.h5 and final.h5 from oracle_dump.
Exit status 0 when every comparison is within tolerance, 1 otherwise (a missing torch is a failure).
"""

import math
import sys

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # In CI a missing oracle is a failure, never a skip.
    print(f"FAIL: the PyTorch oracle needs torch, h5py and numpy for /usr/bin/python3 ({e}).\n"
          "      Install them with: apt-get install python3-torch python3-h5py python3-numpy\n"
          "      (Debian's python3-torch works only with /usr/bin/python3.)", file=sys.stderr)
    sys.exit(1)

# Relative tolerances, ||ours - torch|| / ||torch|| per tensor (per scalar for losses and norms).
# Our model computes in fp32 and the oracle in fp64, so the errors below are fp32 rounding (plus the
# fast exp/tanh approximations of the CPU kernels) accumulated through the network.
TOL = {
    "logits": 1e-5,
    "loss": 1e-5,
    "grad": 1e-4,
    "step_loss": 1e-5,
    "grad_norm": 1e-4,
    "param": 1e-4,
    "adam_m": 1e-4,
    "adam_v": 1e-4,
}
# attn.c_attn.bias holds [q | k | v]. The loss does not depend on the key bias at all (it adds q.b_k
# to every score of a query's row, and softmax ignores a constant shift), so its exact gradient is 0,
# and both implementations return rounding noise there (ours in fp32: ~1e-11, torch in fp64: ~1e-20).
# AdamW turns a gradient g into a step of about lr * g / (|g| + eps): fp32 noise moves the key bias by
# ~1e-3 lr per step, fp64 noise not at all. A relative comparison of the key part is meaningless
# (the reference is ~0), so it is held to an absolute bound: after `steps` steps the key bias moves at
# most steps * lr * g_max / eps. We measured g_max <= 2.2e-11 (5 seeds x 3 shapes x 1/2/4 threads);
# the bound, K_BIAS_FRACTION of the largest possible move lr * steps, admits noise up to 1e-10.
# A real error in the key-bias gradient is caught by the step-0 gradient comparison (by tensor), and
# the q and v parts of the bias keep the relative tolerance.
K_BIAS_FRACTION = 0.01

torch.set_default_dtype(torch.float64)


# ---------------------------------------------------------------------------------------------------
# The model, written from the math. P maps Hugging Face names to fp64 tensors; weights are in the HF
# Conv1D layout [in, out], so a linear layer is x @ W + b.

def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance, as torch.nn.LayerNorm
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w, b, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = x @ w + b  # (B,T,3C)
    q, k, v = qkv.split(C, dim=-1)
    q = q.view(B, T, NH, hs).transpose(1, 2)  # (B,NH,T,hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B,NH,T,T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    scores = scores - scores.max(dim=-1, keepdim=True).values
    e = torch.exp(scores)
    att = e / e.sum(dim=-1, keepdim=True)
    y = att @ v  # (B,NH,T,hs)
    return y.transpose(1, 2).reshape(B, T, C)


def gpt2_logits(P, cfg, idx):
    B, T = idx.shape
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        h = f"h.{l}."
        a = layernorm(x, P[h + "ln_1.weight"], P[h + "ln_1.bias"])
        a = attention(a, P[h + "attn.c_attn.weight"], P[h + "attn.c_attn.bias"], cfg["n_head"])
        x = x + (a @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"])
        m = layernorm(x, P[h + "ln_2.weight"], P[h + "ln_2.bias"])
        m = gelu_tanh(m @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"])
        x = x + (m @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"])
    x = layernorm(x, P["ln_f.weight"], P["ln_f.bias"])
    return x @ P["wte.weight"].T  # tied LM head: (B,T,V)


def cross_entropy_mean(logits, targets):
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    mx = z.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(z - mx).sum(dim=-1)) + mx.squeeze(-1)
    return (lse - z.gather(1, targets.reshape(-1, 1)).squeeze(1)).mean()


def param_names(L):
    names = ["wte.weight", "wpe.weight"]
    for l in range(L):
        h = f"h.{l}."
        names += [h + s for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return names + ["ln_f.weight", "ln_f.bias"]


def takes_decay(name):
    # 2-D weights and the embeddings; biases and layernorm weights take none.
    return name.endswith(".weight") and not any(s in name for s in ("ln_1", "ln_2", "ln_f"))


def hf_shapes(cfg):
    C, V, T, L = cfg["n_embd"], cfg["vocab_size"], cfg["max_seq_len"], cfg["n_layer"]
    s = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(L):
        h = f"h.{l}."
        s.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                  h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                  h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, 4 * C),
                  h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    return s


# ---------------------------------------------------------------------------------------------------
# Comparison bookkeeping.

class Report:
    def __init__(self):
        self.rows = []  # (case, quantity, name, error, tol, kind)

    def rel(self, case, quantity, name, ours, ref, tol):
        ours = np.asarray(ours, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if ours.shape != ref.shape:
            self.rows.append((case, quantity, name, math.inf, tol, f"shape {ours.shape} vs {ref.shape}"))
            return
        diff = np.linalg.norm((ours - ref).ravel())
        den = np.linalg.norm(ref.ravel())
        err = diff / den if den > 0 else diff
        if not np.all(np.isfinite(ours)):
            err = math.inf
        self.rows.append((case, quantity, name, err, tol, "rel" if den > 0 else "abs"))

    def absmax(self, case, quantity, name, ours, ref, tol):
        ours = np.asarray(ours, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        err = float(np.max(np.abs(ours - ref))) if ours.size else 0.0
        if not np.all(np.isfinite(ours)):
            err = math.inf
        self.rows.append((case, quantity, name, err, tol, "absmax"))

    def check(self, case, quantity, name, ok, detail):
        self.rows.append((case, quantity, name, 0.0 if ok else math.inf, 0.0, detail))

    def failures(self):
        return [r for r in self.rows if not (r[3] <= r[4])]

    def print_table(self):
        worst = {}
        for r in self.rows:
            key = (r[0], r[1])
            # worst = largest error relative to its tolerance
            score = r[3] / r[4] if r[4] > 0 else (0.0 if r[3] == 0 else math.inf)
            if key not in worst or score > worst[key][0]:
                worst[key] = (score, r)
        print(f"{'case':<26} {'quantity':<14} {'worst tensor':<28} {'error':>11} {'tol':>9} {'kind':<8} ok")
        for (case, quantity), (_, r) in worst.items():
            ok = "ok" if r[3] <= r[4] else "FAIL"
            print(f"{case:<26} {quantity:<14} {r[2]:<28} {r[3]:>11.3e} {r[4]:>9.1e} {r[5]:<8} {ok}")


def run_case(case_dir, report):
    case = case_dir.rstrip("/").split("/")[-1]
    with h5py.File(f"{case_dir}/init.h5", "r") as f:
        cfg = {k: int(f.attrs[k]) for k in ("n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len")}
        shapes = hf_shapes(cfg)
        names = param_names(cfg["n_layer"])
        # The checkpoint format (section 5): exactly the HF names, HF shapes, fp32.
        got = set()
        f["model"].visititems(lambda n, o: got.add(n) if isinstance(o, h5py.Dataset) else None)
        report.check(case, "ckpt format", "/model names", got == set(names),
                     "names" if got == set(names) else f"diff {sorted(got ^ set(names))[:4]}")
        bad = [n for n in names if n in got and (f["model"][n].shape != shapes[n] or f["model"][n].dtype != np.float32)]
        report.check(case, "ckpt format", "/model shapes", not bad, "shapes" if not bad else f"bad {bad[:3]}")
        init = {n: torch.tensor(f["model"][n][...].astype(np.float64)) for n in names}

    with h5py.File(f"{case_dir}/ours.h5", "r") as f:
        hp = {k: float(f.attrs[k]) for k in ("lr", "weight_decay", "grad_clip", "beta1", "beta2", "eps")}
        steps = int(f.attrs["steps"])
        inputs = torch.tensor(f["inputs"][...].astype(np.int64))
        targets = torch.tensor(f["targets"][...].astype(np.int64))
        ours_logits = f["logits0"][...]
        ours_losses = f["losses"][...]
        ours_norms = f["grad_norms"][...]
        ours_grads = {n: f["grads0"][n][...] for n in names}
        ours_final = {n: f["final"][n][...] for n in names}
        eval_loss = float(f.attrs["eval_loss"])
        pad = {k: float(f.attrs[k]) for k in ("pad_grad_absmax", "pad_param_absmax")}
    with h5py.File(f"{case_dir}/final.h5", "r") as f:
        ckpt_final = {n: f["model"][n][...] for n in names}
        ours_m = {n: f["optimizer/m"][n][...] for n in names}
        ours_v = {n: f["optimizer/v"][n][...] for n in names}
        opt_step = int(f["optimizer"].attrs["step"])

    P = {n: t.clone().requires_grad_(True) for n, t in init.items()}

    # ---- step 0: logits, loss, gradients
    with torch.no_grad():
        logits = gpt2_logits(P, cfg, inputs[0])
        loss0 = cross_entropy_mean(logits, targets[0]).item()
    report.rel(case, "logits", "logits0", ours_logits, logits.numpy(), TOL["logits"])
    report.rel(case, "loss", "loss0 (train)", ours_losses[0], loss0, TOL["loss"])
    report.rel(case, "loss", "loss0 (eval)", eval_loss, loss0, TOL["loss"])

    # ---- steps: clip_grad_norm_ + AdamW, the grads of step 0 compared on the way
    params = [P[n] for n in names]
    groups = [{"params": [P[n] for n in names if takes_decay(n)], "weight_decay": hp["weight_decay"]},
              {"params": [P[n] for n in names if not takes_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = cross_entropy_mean(gpt2_logits(P, cfg, inputs[s]), targets[s])
        loss.backward()
        if s == 0:
            for n in names:
                report.rel(case, "grad", n, ours_grads[n], P[n].grad.numpy(), TOL["grad"])
        if hp["grad_clip"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm=hp["grad_clip"]))
        else:
            norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        report.rel(case, "step loss", f"step {s}", ours_losses[s], loss.item(), TOL["step_loss"])
        report.rel(case, "grad norm", f"step {s}", ours_norms[s], norm, TOL["grad_norm"])
        opt.step()

    # ---- final parameters and moments
    C = cfg["n_embd"]
    bound_k = K_BIAS_FRACTION * hp["lr"] * steps
    for n in names:
        ref = P[n].detach().numpy()
        st = opt.state[P[n]]
        m_ref, v_ref = st["exp_avg"].numpy(), st["exp_avg_sq"].numpy()
        if n.endswith("attn.c_attn.bias"):
            qv = np.r_[0:C, 2 * C:3 * C]
            report.rel(case, "param", n + "[q,v]", ours_final[n][qv], ref[qv], TOL["param"])
            report.absmax(case, "param k-bias", n + "[k]", ours_final[n][C:2 * C], ref[C:2 * C], bound_k)
            report.rel(case, "adam m", n + "[q,v]", ours_m[n][qv], m_ref[qv], TOL["adam_m"])
            report.rel(case, "adam v", n + "[q,v]", ours_v[n][qv], v_ref[qv], TOL["adam_v"])
        else:
            report.rel(case, "param", n, ours_final[n], ref, TOL["param"])
            report.rel(case, "adam m", n, ours_m[n], m_ref, TOL["adam_m"])
            report.rel(case, "adam v", n, ours_v[n], v_ref, TOL["adam_v"])
        same = np.array_equal(ckpt_final[n], ours_final[n])
        report.check(case, "ckpt == mem", n, same, "bitwise")
    report.check(case, "ckpt format", "optimizer step", opt_step == steps, f"step={opt_step}")
    # Invariant (params.hpp): the padding rows of wte get no gradient and stay zero.
    report.check(case, "wte padding", "grad rows == 0", pad["pad_grad_absmax"] == 0.0,
                 f"max {pad['pad_grad_absmax']:.1e}")
    report.check(case, "wte padding", "param rows == 0", pad["pad_param_absmax"] == 0.0,
                 f"max {pad['pad_param_absmax']:.1e}")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    report = Report()
    for d in argv[1:]:
        run_case(d, report)
    report.print_table()
    fails = report.failures()
    if fails:
        print(f"\nFAIL: {len(fails)} comparison(s) out of tolerance:")
        for case, quantity, name, err, tol, kind in fails[:40]:
            print(f"  {case}: {quantity} {name}: error {err:.3e} > tol {tol:.1e} ({kind})")
        return 1
    print(f"\nPASS: {len(report.rows)} comparisons within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
