// oracle_dump: runs our CPU GPT-2 on a small deterministic problem and writes everything the PyTorch
// oracle (torch_gpt2.py, DESIGN.md section 7) compares against:
//   OUT_DIR/init.h5   the initial checkpoint (model only), written by save_checkpoint
//   OUT_DIR/ours.h5   the batches, step-0 logits/loss/gradients, per-step losses and grad norms,
//                     and the parameters after `steps` AdamW steps (Hugging Face names and shapes)
//   OUT_DIR/final.h5  the checkpoint after the last step, with the optimizer moments
//
// usage: oracle_dump OUT_DIR L NH C V maxT B T seed steps lr weight_decay grad_clip beta1 beta2 eps
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "core/rng.hpp"
#include "kernels/reduce/reduce.hpp"
#include "model/gpt2.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"

namespace {

using gpt2::h5::Id;

std::vector<hsize_t> hshape(const std::vector<size_t>& s) { return std::vector<hsize_t>(s.begin(), s.end()); }

void write_i32(hid_t loc, const std::string& name, const int32_t* data, const std::vector<hsize_t>& shape) {
  Id space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  H5_CHECK(space.get(), "dataspace for " << name);
  Id ds(H5Dcreate2(loc, name.c_str(), H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(ds.get(), "create dataset " << name);
  H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write dataset " << name);
}

void write_f64(hid_t loc, const std::string& name, const double* data, hsize_t n) {
  Id space(H5Screate_simple(1, &n, nullptr));
  H5_CHECK(space.get(), "dataspace for " << name);
  Id ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(ds.get(), "create dataset " << name);
  H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write dataset " << name);
}

// Largest |x| over the padding rows of wte (rows vocab_size..padded_vocab_size-1): they must stay 0.
double wte_padding_absmax(const gpt2::GPT2Config& cfg, const float* wte) {
  double m = 0.0;
  const size_t C = cfg.n_embd;
  for (size_t i = static_cast<size_t>(cfg.vocab_size) * C; i < static_cast<size_t>(cfg.padded_vocab_size()) * C; ++i)
    m = std::fmax(m, std::fabs(static_cast<double>(wte[i])));
  return m;
}

// Writes every tensor of a flat buffer (parameters or gradients) under its Hugging Face name and shape.
void write_tensors(hid_t group, const gpt2::ParamTable& table, const float* base) {
  for (const gpt2::ParamInfo& p : table.params()) gpt2::h5::write_f32(group, p.name, base + p.offset, hshape(p.hf_shape));
}

int to_int(const char* s) { return std::atoi(s); }
float to_float(const char* s) { return std::strtof(s, nullptr); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 17) {
    std::cerr << "usage: " << argv[0]
              << " OUT_DIR L NH C V maxT B T seed steps lr weight_decay grad_clip beta1 beta2 eps\n";
    return 2;
  }
  const std::string out = argv[1];
  gpt2::GPT2Config cfg;
  cfg.n_layer = to_int(argv[2]);
  cfg.n_head = to_int(argv[3]);
  cfg.n_embd = to_int(argv[4]);
  cfg.vocab_size = to_int(argv[5]);
  cfg.max_seq_len = to_int(argv[6]);
  const int B = to_int(argv[7]), T = to_int(argv[8]);
  const uint64_t seed = std::strtoull(argv[9], nullptr, 10);
  const int steps = to_int(argv[10]);
  const float lr = to_float(argv[11]);
  gpt2::AdamWConfig ocfg;
  ocfg.weight_decay = to_float(argv[12]);
  ocfg.grad_clip = to_float(argv[13]);
  ocfg.beta1 = to_float(argv[14]);
  ocfg.beta2 = to_float(argv[15]);
  ocfg.eps = to_float(argv[16]);
  if (steps < 1 || B < 1 || T < 1) {
    std::cerr << "oracle_dump: steps, B and T must be positive\n";
    return 2;
  }

  gpt2::GPT2 model(cfg);
  model.init(seed);
  gpt2::TrainState state;
  state.seed = seed;
  gpt2::save_checkpoint(out + "/init.h5", model, nullptr, state);

  // One batch per step: windows of T+1 random tokens, inputs = window[0:T], targets = window[1:T+1].
  const size_t BT = static_cast<size_t>(B) * T;
  std::vector<int32_t> inputs(steps * BT), targets(steps * BT);
  for (int s = 0; s < steps; ++s) {
    gpt2::Rng rng(seed, 0x0AC1E000ULL + static_cast<uint64_t>(s));
    for (int b = 0; b < B; ++b) {
      std::vector<int32_t> w(T + 1);
      for (auto& t : w) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
      for (int t = 0; t < T; ++t) {
        inputs[s * BT + b * T + t] = w[t];
        targets[s * BT + b * T + t] = w[t + 1];
      }
    }
  }

  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  // Step-0 logits, real vocabulary columns only. forward_train later overwrites logits with dlogits.
  std::vector<float> logits(BT * V);
  double pad_logit_absmax = 0.0;
  {
    const float* lg = model.forward_logits(inputs.data(), B, T);
    for (size_t i = 0; i < BT; ++i) {
      for (int j = 0; j < V; ++j) logits[i * V + j] = lg[i * Vp + j];
      for (int j = V; j < Vp; ++j) pad_logit_absmax = std::fmax(pad_logit_absmax, std::fabs(lg[i * Vp + j]));
    }
  }
  const float eval_loss = model.forward_eval(inputs.data(), targets.data(), B, T);

  gpt2::AdamW opt(model.table().segments(), {{0, model.table().total()}}, ocfg);
  const float dloss = 1.0f / static_cast<float>(BT);
  std::vector<double> losses(steps), norms(steps);
  std::vector<float> grads0;
  double pad_grad_absmax = 0.0;
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    losses[s] = model.forward_train(inputs.data() + s * BT, targets.data() + s * BT, B, T, dloss);
    model.backward();
    const auto& g = model.grads();
    pad_grad_absmax = std::fmax(pad_grad_absmax, wte_padding_absmax(cfg, g.data()));
    if (s == 0) grads0 = g;
    norms[s] = std::sqrt(gpt2::kernels::sum_squares_cpu(g.data(), static_cast<long>(g.size())));
    opt.step(model.params().data(), g.data(), lr, gpt2::clip_factor(norms[s], ocfg.grad_clip));
  }
  state.step = steps;
  state.tokens_seen = static_cast<int64_t>(steps) * static_cast<int64_t>(BT);
  const gpt2::OptimizerState os{ocfg, opt.step_count(), opt.m().data(), opt.v().data()};
  gpt2::save_checkpoint(out + "/final.h5", model, &os, state);

  {
    const std::string path = out + "/ours.h5";
    Id f = gpt2::h5::create(path);
    gpt2::h5::write_attr_i64(f.get(), "B", B);
    gpt2::h5::write_attr_i64(f.get(), "T", T);
    gpt2::h5::write_attr_i64(f.get(), "steps", steps);
    // The hyperparameters as the fp32 values we used, so the oracle runs with exactly these numbers.
    gpt2::h5::write_attr_f64(f.get(), "lr", lr);
    gpt2::h5::write_attr_f64(f.get(), "weight_decay", ocfg.weight_decay);
    gpt2::h5::write_attr_f64(f.get(), "grad_clip", ocfg.grad_clip);
    gpt2::h5::write_attr_f64(f.get(), "beta1", ocfg.beta1);
    gpt2::h5::write_attr_f64(f.get(), "beta2", ocfg.beta2);
    gpt2::h5::write_attr_f64(f.get(), "eps", ocfg.eps);
    gpt2::h5::write_attr_f64(f.get(), "dloss", dloss);
    gpt2::h5::write_attr_f64(f.get(), "eval_loss", eval_loss);
    gpt2::h5::write_attr_f64(f.get(), "pad_logit_absmax", pad_logit_absmax);
    gpt2::h5::write_attr_f64(f.get(), "pad_grad_absmax", pad_grad_absmax);
    gpt2::h5::write_attr_f64(f.get(), "pad_param_absmax", wte_padding_absmax(cfg, model.params().data()));
    const std::vector<hsize_t> sbt{static_cast<hsize_t>(steps), static_cast<hsize_t>(B), static_cast<hsize_t>(T)};
    write_i32(f.get(), "inputs", inputs.data(), sbt);
    write_i32(f.get(), "targets", targets.data(), sbt);
    gpt2::h5::write_f32(f.get(), "logits0", logits.data(),
                        {static_cast<hsize_t>(B), static_cast<hsize_t>(T), static_cast<hsize_t>(V)});
    write_f64(f.get(), "losses", losses.data(), steps);
    write_f64(f.get(), "grad_norms", norms.data(), steps);
    Id gg = gpt2::h5::create_group(f.get(), "grads0");
    write_tensors(gg.get(), model.table(), grads0.data());
    Id gp = gpt2::h5::create_group(f.get(), "final");
    write_tensors(gp.get(), model.table(), model.params().data());
    H5_CHECK(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), "flush " << path);
  }
  std::printf("oracle_dump: %s, B=%d T=%d, %d steps: loss %.6f -> %.6f, wrote %s/{init,ours,final}.h5\n",
              cfg.describe().c_str(), B, T, steps, losses.front(), losses.back(), out.c_str());
  return 0;
}
