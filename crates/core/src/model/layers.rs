//! The pieces a family composes: attention (q/k/v with or without biases, with or without a
//! per-head q/k norm, rope, the KV write), the gated MLP, RMS norms, and the loader that reads
//! them from a checkpoint onto a backend. A family file ([`super::llama`], [`super::qwen3`])
//! says which pieces a decoder layer has and under which tensor names; the forward pass over
//! the layers ([`super::Model::launch`]) is written once.

use crate::backend::{Backend, DType, KvDest, MoeExpert, NormIn};
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::lora::slots::LoraAt;
use crate::lora::Proj;
use crate::weights::{TensorView, Weights};

/// One decoder layer: pre-norm attention, then pre-norm feed-forward, each added to the
/// residual stream; where the family has them (Gemma 3), the attention's and the feed-forward's
/// outputs are normed before they are added ("sandwich" norms).
pub(crate) struct Layer<B: Backend> {
    pub input_norm: B::Buf,
    pub attn: Attention<B>,
    /// The feed-forward block's input norm (HF: `post_attention_layernorm` in Llama,
    /// `pre_feedforward_layernorm` in Gemma 3).
    pub post_norm: B::Buf,
    pub ffn: Ffn<B>,
    /// The norms of the attention's and the feed-forward's outputs (Gemma 3's
    /// `post_attention_layernorm` and `post_feedforward_layernorm`), both or neither.
    pub out_norms: Option<(B::Buf, B::Buf)>,
}

/// A family's decoder layer `i`, read by the loader (each family file's `layer`).
pub(crate) type LayerFn<B> = fn(&mut Loader<'_, B>, usize) -> Result<Layer<B>>;

/// The attention projections: one weight when the backend fuses them (`FusedOps::fuse_qkv`).
pub(crate) enum Qkv<B: Backend> {
    Fused { w: B::Buf, bias: Option<B::Buf> },
    Split { q: B::Buf, k: B::Buf, v: B::Buf, q_bias: Option<B::Buf>, k_bias: Option<B::Buf>, v_bias: Option<B::Buf> },
}

/// What sets one family's attention apart from another's.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttnOptions {
    /// q, k and v carry biases (Qwen2).
    pub bias: bool,
    /// An RMS norm over each head of q and of k (weights `[head_dim]`, shared by the heads),
    /// after the projection and before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
}

pub(crate) struct Attention<B: Backend> {
    pub qkv: Qkv<B>,
    pub o: B::Buf,
    /// `(q_norm, k_norm)`, each `[head_dim]`, where [`AttnOptions::qk_norm`].
    pub qk_norm: Option<(B::Buf, B::Buf)>,
}

/// The MLP's gate and up projections: one weight when the backend fuses them.
pub(crate) enum GateUp<B: Backend> {
    Fused(B::Buf),
    Split { gate: B::Buf, up: B::Buf },
}

/// The gated MLP: `down(act(gate(x)) * up(x))`, of width `inter`.
pub(crate) struct Mlp<B: Backend> {
    pub gate_up: GateUp<B>,
    pub down: B::Buf,
    pub inter: usize,
    pub act: Activation,
}

/// A mixture of experts: a router (`[experts, hidden]`), its routing ([`Ops::moe_route`]:
/// softmax, top-k, renormalised or not), and gated-MLP experts whose outputs are added, each
/// scaled by its routing weight, in expert order ([`Ops::moe_accumulate`]).
///
/// Every expert runs over every token of the step, and a weight of 0 adds nothing: a token's
/// result depends on its own routing only, never on which other tokens share its experts
/// (batch invariance), and the step's ops follow from its shape alone (graph capture). The
/// price is compute: `experts / top_k` times the dense work of the routed experts. A backend
/// with a routed path ([`FusedOps::moe_prepare`] gave `routed`) runs each expert over its own
/// tokens instead ([`FusedOps::moe_routed`]), with the same bits.
pub(crate) struct Moe<B: Backend> {
    pub router: B::Buf,
    pub experts: Vec<Mlp<B>>,
    pub top_k: usize,
    pub renormalize: bool,
    pub routed: Option<B::Buf>,
}

/// A layer's feed-forward block.
pub(crate) enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(Moe<B>),
}

impl<B: Backend> Layer<B> {
    /// A pre-norm layer: `input_norm`, attention, `post_norm` (the feed-forward's input norm),
    /// the feed-forward block; optional pieces are added with the `with_` methods.
    pub fn new(input_norm: B::Buf, attn: Attention<B>, post_norm: B::Buf, ffn: Ffn<B>) -> Self {
        Layer { input_norm, attn, post_norm, ffn, out_norms: None }
    }

    /// The layer with norms on the attention's and the feed-forward's outputs ("sandwich"
    /// norms, Gemma 3).
    pub fn with_out_norms(self, attn_out: B::Buf, ffn_out: B::Buf) -> Self {
        Layer { out_norms: Some((attn_out, ffn_out)), ..self }
    }

    /// Whether this layer's projections are the fused ones the norm-fused path needs
    /// (`FusedOps::fuses_norm`): fused q/k/v and a dense MLP with fused gate/up.
    pub fn fully_fused(&self) -> bool {
        self.out_norms.is_none()
            && matches!(self.attn.qkv, Qkv::Fused { .. })
            && matches!(&self.ffn, Ffn::Dense(Mlp { gate_up: GateUp::Fused(_), .. }))
    }
}

/// The buffers [`Attention::project`] writes: q (rotated, what attention reads), k and v
/// (scratch afterwards), and where the family norms q and k, their raw projections.
pub(crate) struct QkvBufs<'a, B: Backend> {
    pub q: &'a mut B::Buf,
    pub k: &'a mut B::Buf,
    pub v: &'a mut B::Buf,
    /// `[T, q_dim]` and `[T, kv_dim]` f32, allocated only for a family with q/k norm.
    pub raw: Option<(&'a mut B::Buf, &'a mut B::Buf)>,
}

impl<B: Backend> Attention<B> {
    /// q, k and v of `t` tokens from `x` (or, with `norm`, from `h ∘ gamma`: see [`NormIn`]),
    /// q/k normed where the family says so, rotated, and K/V written into the layer's cache.
    /// Without q/k norm or adapters this is the backend's `qkv_rope_kv_write` (fused where it
    /// fuses); otherwise the projection lands in q, k, v (or the raw buffers), the adapters'
    /// updates are added there ([`LoraAt`]), each head is normed into q and k where the family
    /// norms them, then `rope_kv_write`, so every backend runs it with the ops it already has.
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &self,
        b: &B,
        c: &ModelConfig,
        x: &B::Buf,
        norm: Option<NormIn<'_, B::Buf>>,
        bufs: QkvBufs<'_, B>,
        kv: KvDest<'_, B::Buf>,
        t: usize,
        mut lora: Option<&mut LoraAt<'_, B>>,
    ) -> Result<()> {
        let (d, qd, hd) = (c.hidden_size, c.q_dim(), c.head_dim);
        let QkvBufs { q, k, v, raw } = bufs;
        if let (None, Qkv::Fused { w, bias }, None) = (&self.qk_norm, &self.qkv, &lora) {
            return b.qkv_rope_kv_write(x, w, bias.as_ref(), q, k, v, t, qd, d, norm, kv);
        }
        let mut updates = |b: &B, q: &mut B::Buf, k: &mut B::Buf, v: &mut B::Buf| -> Result<()> {
            if let Some(l) = lora.as_deref_mut() {
                l.apply(b, c, Proj::Q, x, q, t)?;
                l.apply(b, c, Proj::K, x, k, t)?;
                l.apply(b, c, Proj::V, x, v, t)?;
            }
            Ok(())
        };
        match (&self.qk_norm, raw) {
            (None, _) => {
                self.qkv_only(b, c, x, norm, q, k, v, t)?;
                updates(b, q, k, v)?;
            }
            (Some((q_norm, k_norm)), Some((q_raw, k_raw))) => {
                self.qkv_only(b, c, x, norm, q_raw, k_raw, v, t)?;
                updates(b, q_raw, k_raw, v)?;
                // Each head's row of head_dim values is one row of the norm.
                b.rms_norm(q_raw, q_norm, q, t * c.num_attention_heads, hd, c.rms_norm_eps)?;
                b.rms_norm(k_raw, k_norm, k, t * c.num_key_value_heads, hd, c.rms_norm_eps)?;
            }
            (Some(_), None) => {
                return Err(crate::error::Error::backend(b.name(), "q/k norm without its scratch buffers"))
            }
        }
        b.rope_kv_write(
            q,
            k,
            v,
            kv.k_cache,
            kv.v_cache,
            kv.positions,
            kv.inv_freq,
            kv.slots,
            t,
            c.num_attention_heads,
            kv.geometry,
        )
    }

    /// The q, k and v projections alone (fused where the backend fused them at load).
    #[allow(clippy::too_many_arguments)]
    fn qkv_only(
        &self,
        b: &B,
        c: &ModelConfig,
        x: &B::Buf,
        norm: Option<NormIn<'_, B::Buf>>,
        q: &mut B::Buf,
        k: &mut B::Buf,
        v: &mut B::Buf,
        t: usize,
    ) -> Result<()> {
        let (d, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        match &self.qkv {
            Qkv::Fused { w, bias } => b.qkv_proj(x, w, bias.as_ref(), q, k, v, t, qd, kvd, d, norm),
            Qkv::Split { q: wq, k: wk, v: wv, q_bias, k_bias, v_bias } => {
                b.matmul(x, wq, q_bias.as_ref(), q, t, qd, d)?;
                b.matmul(x, wk, k_bias.as_ref(), k, t, kvd, d)?;
                b.matmul(x, wv, v_bias.as_ref(), v, t, kvd, d)
            }
        }
    }
}

/// Reads a family's pieces from a checkpoint onto a backend, and notes the weight types each
/// stored activation meets ([`super::ActDtypes`]).
pub(crate) struct Loader<'a, B: Backend> {
    pub b: &'a B,
    pub w: &'a Weights,
    pub cfg: &'a ModelConfig,
    /// Weight types of the matmuls that read the norms' output x (q/k/v, gate/up, router).
    pub x_readers: Vec<DType>,
    /// Weight types of the matmuls that read the MLP activation (down).
    pub act_readers: Vec<DType>,
    /// RMS norm weights are stored as `w - 1`: the norm multiplies by `1 + w` (Gemma). The
    /// loader uploads `1 + w` in f32 (HF adds in f32 too), so every backend's norm is the plain one.
    pub norm_plus_one: bool,
    /// Gate and up stay apart even where the backend fuses them (`FusedOps::fuse_gate_up`):
    /// LoRA updates each before the activation.
    pub split_gate_up: bool,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn new(b: &'a B, w: &'a Weights, cfg: &'a ModelConfig) -> Self {
        Loader { b, w, cfg, x_readers: vec![], act_readers: vec![], norm_plus_one: false, split_gate_up: false }
    }

    /// A weight of this exact shape, uploaded.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<B::Buf> {
        self.b.upload_weight(&self.w.get(name, shape)?)
    }

    /// An RMS norm's weight `[hidden]`.
    pub fn norm(&self, name: &str) -> Result<B::Buf> {
        self.norm_of(name, self.cfg.hidden_size)
    }

    /// An RMS norm's weight `[dim]`, as [`Loader::norm_plus_one`] says.
    pub fn norm_of(&self, name: &str, dim: usize) -> Result<B::Buf> {
        let view = self.w.get(name, &[dim])?;
        match self.norm_plus_one {
            true => self.b.weight_from_f32(DType::F32, &view.to_f32().iter().map(|w| 1.0 + w).collect::<Vec<_>>()),
            false => self.b.upload_weight(&view),
        }
    }

    /// Attention under `prefix` with HF's names: `{q,k,v,o}_proj.weight`, `{q,k,v}_proj.bias`
    /// where `opt.bias`, `{q,k}_norm.weight` where `opt.qk_norm`.
    pub fn attention(&mut self, prefix: &str, opt: AttnOptions) -> Result<Attention<B>> {
        let c = self.cfg;
        let (d, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let view = |n: &str, shape: &[usize]| self.w.get(&format!("{prefix}.{n}"), shape);
        let qkv =
            [view("q_proj.weight", &[qd, d])?, view("k_proj.weight", &[kvd, d])?, view("v_proj.weight", &[kvd, d])?];
        let biases = match opt.bias {
            true => Some([view("q_proj.bias", &[qd])?, view("k_proj.bias", &[kvd])?, view("v_proj.bias", &[kvd])?]),
            false => None,
        };
        self.attention_of(prefix, qkv, biases, opt)
    }

    /// Attention under `prefix` whose q, k and v projections are one weight `{prefix}.{fused}.weight`
    /// (`[q_dim + 2 kv_dim, hidden]`, q's rows then k's then v's: Phi-3's `qkv_proj`), split at
    /// load; the rest as [`Loader::attention`] (no biases).
    pub fn attention_fused(&mut self, prefix: &str, fused: &str, opt: AttnOptions) -> Result<Attention<B>> {
        let c = self.cfg;
        let (d, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let w = self.w.get(&format!("{prefix}.{fused}.weight"), &[qd + 2 * kvd, d])?;
        let qkv = [w.rows(0..qd)?, w.rows(qd..qd + kvd)?, w.rows(qd + kvd..qd + 2 * kvd)?];
        self.attention_of(prefix, qkv, None, AttnOptions { bias: false, ..opt })
    }

    /// Attention from its q, k, v weights (and biases), its o and q/k norms under `prefix`.
    fn attention_of(
        &mut self,
        prefix: &str,
        [qv, kv, vv]: [TensorView; 3],
        biases: Option<[TensorView; 3]>,
        opt: AttnOptions,
    ) -> Result<Attention<B>> {
        let (b, c) = (self.b, self.cfg);
        let (d, qd) = (c.hidden_size, c.q_dim());
        let qkv = match b.fuse_qkv(&qv, &kv, &vv, biases.as_ref().map(|[x, y, z]| [x, y, z]))? {
            Some((w, bias)) => Qkv::Fused { w, bias },
            None => {
                let bias = |i: usize| biases.as_ref().map(|bs| b.upload_weight(&bs[i])).transpose();
                Qkv::Split {
                    q: b.upload_weight(&qv)?,
                    k: b.upload_weight(&kv)?,
                    v: b.upload_weight(&vv)?,
                    q_bias: bias(0)?,
                    k_bias: bias(1)?,
                    v_bias: bias(2)?,
                }
            }
        };
        self.x_readers.extend([qv.dtype, kv.dtype, vv.dtype]);
        let qk_norm = match opt.qk_norm {
            true => Some((
                self.norm_of(&format!("{prefix}.q_norm.weight"), c.head_dim)?,
                self.norm_of(&format!("{prefix}.k_norm.weight"), c.head_dim)?,
            )),
            false => None,
        };
        Ok(Attention { qkv, o: self.tensor(&format!("{prefix}.o_proj.weight"), &[d, qd])?, qk_norm })
    }

    /// A gated MLP of width `inter` under `prefix`, its projections named `gate`, `up`, `down`
    /// (`{prefix}.{name}.weight`).
    pub fn mlp(&mut self, prefix: &str, [gate, up, down]: [&str; 3], inter: usize) -> Result<Mlp<B>> {
        let d = self.cfg.hidden_size;
        let (gv, uv) = (
            self.w.get(&format!("{prefix}.{gate}.weight"), &[inter, d])?,
            self.w.get(&format!("{prefix}.{up}.weight"), &[inter, d])?,
        );
        let dv = self.w.get(&format!("{prefix}.{down}.weight"), &[d, inter])?;
        self.mlp_of(gv, uv, dv, inter)
    }

    /// A gated MLP of width `inter` under `prefix` whose gate and up projections are one weight
    /// `{prefix}.{gate_up}.weight` (`[2 inter, hidden]`, the gate's rows first: Phi-3's
    /// `gate_up_proj`), split at load, and its down projection `{prefix}.{down}.weight`.
    pub fn mlp_fused(&mut self, prefix: &str, [gate_up, down]: [&str; 2], inter: usize) -> Result<Mlp<B>> {
        let d = self.cfg.hidden_size;
        let w = self.w.get(&format!("{prefix}.{gate_up}.weight"), &[2 * inter, d])?;
        let dv = self.w.get(&format!("{prefix}.{down}.weight"), &[d, inter])?;
        self.mlp_of(w.rows(0..inter)?, w.rows(inter..2 * inter)?, dv, inter)
    }

    fn mlp_of(&mut self, gv: TensorView, uv: TensorView, dv: TensorView, inter: usize) -> Result<Mlp<B>> {
        let b = self.b;
        self.x_readers.extend([gv.dtype, uv.dtype]);
        self.act_readers.push(dv.dtype);
        let act = self.cfg.activation;
        let fused = if self.split_gate_up { None } else { b.fuse_gate_up(&gv, &uv)? };
        let gate_up = match fused {
            Some(w) => GateUp::Fused(w),
            None => GateUp::Split { gate: b.upload_weight(&gv)?, up: b.upload_weight(&uv)? },
        };
        Ok(Mlp { gate_up, down: b.upload_weight(&dv)?, inter, act })
    }

    /// A mixture of experts under `prefix`: the router `{prefix}.{router}.weight` and expert `e`
    /// at `{prefix}.experts.{e}` with projections named `names` (as [`Loader::mlp`]), all of
    /// the config's `moe` settings.
    pub fn moe(&mut self, prefix: &str, router: &str, names: [&str; 3]) -> Result<Moe<B>> {
        let m = self.cfg.moe.clone().ok_or_else(|| {
            crate::error::Error::config(
                std::path::Path::new("config.json"),
                "a mixture-of-experts layer without its settings",
            )
        })?;
        let rv = self.w.get(&format!("{prefix}.{router}.weight"), &[m.num_experts, self.cfg.hidden_size])?;
        self.x_readers.push(rv.dtype);
        let router = self.b.upload_weight(&rv)?;
        let experts = (0..m.num_experts)
            .map(|e| self.mlp(&format!("{prefix}.experts.{e}"), names, m.intermediate_size))
            .collect::<Result<Vec<_>>>()?;
        // The routed path (FusedOps::moe_routed) computes silu: another activation runs the
        // experts one by one.
        let routed = match self.cfg.activation {
            Activation::Silu => {
                self.b.moe_prepare(&expert_refs(&experts), self.cfg.hidden_size, m.intermediate_size)?
            }
            Activation::GeluTanh => None,
        };
        Ok(Moe { router, experts, top_k: m.top_k, renormalize: m.norm_topk_prob, routed })
    }
}

/// The scratch an MLP or a mixture of experts runs in, `[T, width]` or `[T, hidden]` f32
/// unless said otherwise.
pub(crate) struct FfnBufs<'a, B: Backend> {
    /// The normed input (`ActDtypes::x`).
    pub x: &'a B::Buf,
    pub gate: &'a mut B::Buf,
    pub up: &'a mut B::Buf,
    /// `[T, width]` (`ActDtypes::act`).
    pub act: &'a mut B::Buf,
    /// The block's output `[T, hidden]`, added to the residual afterwards.
    pub out: &'a mut B::Buf,
    /// MoE only: router logits and routing weights `[T, experts]`, one expert's output `[T, hidden]`.
    pub moe: Option<(&'a mut B::Buf, &'a mut B::Buf, &'a mut B::Buf)>,
}

impl<B: Backend> Mlp<B> {
    /// `act = act(gate(x)) * up(x)` (fused where the backend fuses; `norm` as in
    /// [`FusedOps::gate_up_act`]), the adapters' updates added to gate and up (which the
    /// loader then keeps apart: [`Loader::split_gate_up`]).
    #[allow(clippy::too_many_arguments)]
    pub fn activation(
        &self,
        b: &B,
        c: &ModelConfig,
        x: &B::Buf,
        gate: &mut B::Buf,
        up: &mut B::Buf,
        act: &mut B::Buf,
        t: usize,
        norm: Option<NormIn<'_, B::Buf>>,
        lora: Option<&mut LoraAt<'_, B>>,
    ) -> Result<()> {
        let (inter, d) = (self.inter, c.hidden_size);
        match (&self.gate_up, lora) {
            (GateUp::Fused(w), None) => b.gate_up_act(self.act, x, w, act, t, inter, d, norm),
            (GateUp::Fused(_), Some(_)) => {
                Err(crate::error::Error::backend(b.name(), "LoRA over a fused gate/up projection (load it split)"))
            }
            (GateUp::Split { gate: wg, up: wu }, lora) => {
                b.matmul(x, wg, None, gate, t, inter, d)?;
                b.matmul(x, wu, None, up, t, inter, d)?;
                if let Some(l) = lora {
                    l.apply(b, c, Proj::Gate, x, gate, t)?;
                    l.apply(b, c, Proj::Up, x, up, t)?;
                }
                match self.act {
                    Activation::Silu => b.silu_mul(gate, up, act, t * inter),
                    Activation::GeluTanh => b.gelu_tanh_mul(gate, up, act, t * inter),
                }
            }
        }
    }
}

impl<B: Backend> Moe<B> {
    /// The block's output for `t` tokens into `bufs.out`: route, then every expert in order,
    /// its output scaled and added.
    pub fn forward(&self, b: &B, c: &ModelConfig, bufs: FfnBufs<'_, B>, t: usize) -> Result<()> {
        let d = c.hidden_size;
        let FfnBufs { x, gate, up, act, out, moe } = bufs;
        let Some((logits, weights, y)) = moe else {
            return Err(crate::error::Error::backend(b.name(), "a mixture of experts without its scratch buffers"));
        };
        let n = self.experts.len();
        b.matmul(x, &self.router, None, logits, t, n, d)?;
        b.moe_route(logits, weights, t, n, self.top_k, self.renormalize)?;
        if let Some(table) = &self.routed {
            let inter = self.experts.first().map_or(0, |m| m.inter);
            return b.moe_routed(table, &expert_refs(&self.experts), x, weights, out, t, d, inter, self.top_k);
        }
        for (e, mlp) in self.experts.iter().enumerate() {
            mlp.activation(b, c, x, gate, up, act, t, None, None)?;
            b.matmul(act, &mlp.down, None, y, t, d, mlp.inter)?;
            b.moe_accumulate(out, y, weights, t, d, e, n, e == 0)?;
        }
        Ok(())
    }
}

/// The experts' weights as [`FusedOps::moe_prepare`] and [`FusedOps::moe_routed`] take them.
fn expert_refs<B: Backend>(experts: &[Mlp<B>]) -> Vec<MoeExpert<'_, B::Buf>> {
    experts
        .iter()
        .map(|m| match &m.gate_up {
            GateUp::Fused(w) => MoeExpert { gate: w, up: None, down: &m.down },
            GateUp::Split { gate, up } => MoeExpert { gate, up: Some(up), down: &m.down },
        })
        .collect()
}

/// HF's names of a Llama-style MLP's projections.
pub(crate) const MLP_NAMES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
