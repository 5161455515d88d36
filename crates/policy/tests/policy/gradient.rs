//! The gradient of the chain log-likelihood w.r.t. parameters equals central finite
//! differences (on a tiny network, in f32 with a tolerance that fits f32 round-off).

use crate::common;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use common::*;
use diffrl_core::seeding::rng;
use diffrl_policy::{Policy, PolicyModel, SampleMode};

/// Records (id, element count) of every float parameter in visit order.
struct List(Vec<(ParamId, usize)>);
impl<Bk: Backend> ModuleVisitor<Bk> for List {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
        self.0.push((p.id, p.val().shape().num_elements()));
    }
}

/// Reads element `j` of the gradient of parameter `id`.
struct GradAt<'a> {
    id: ParamId,
    j: usize,
    grads: &'a <AD as AutodiffBackend>::Gradients,
    out: Option<f32>,
}
impl ModuleVisitor<AD> for GradAt<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<AD, D>>) {
        if p.id == self.id {
            let g = p.val().grad(self.grads).expect("parameter has a gradient");
            self.out = Some(to_vec(g)[self.j]);
        }
    }
}

/// Adds `delta` to element `j` of parameter `id`.
struct Perturb {
    id: ParamId,
    j: usize,
    delta: f32,
}
impl<Bk: Backend> ModuleMapper<Bk> for Perturb {
    fn map_float<const D: usize>(&mut self, p: Param<Tensor<Bk, D>>) -> Param<Tensor<Bk, D>> {
        let (id, t, mapper) = p.consume();
        let t = if id == self.id {
            let shape = t.shape();
            let device = t.device();
            let mut v = to_vec(t);
            v[self.j] += self.delta;
            Tensor::from_data(TensorData::new(v, shape), &device)
        } else {
            t
        };
        Param::from_mapped_value(id, t, mapper)
    }
}

#[test]
fn chain_log_prob_gradient_matches_finite_differences() {
    let device = Default::default();
    let mut cfg = tiny_config(4);
    cfg.diffusion.ft_denoising_steps = 3;
    let policy = Policy::<AD>::new(cfg, spec(), norm(), 21, &device).unwrap();
    let o = obs(3);
    let act = policy
        .valid()
        .act(None, &o, SampleMode::Stochastic, true, &mut rng(4), &device)
        .unwrap();
    let chain_data = act.sample.chain.unwrap().into_data();
    let obs_t = policy.obs_tensors(&o, &device).unwrap();
    let total = |p: &Policy<AD>| -> Tensor<AD, 1> {
        let chain = Tensor::from_data(chain_data.clone(), &device);
        p.chain_logprobs(&obs_t, chain).sum()
    };
    let grads = total(&policy).backward();
    let mut list = List(Vec::new());
    policy.model.visit(&mut list);
    assert!(list.0.len() >= 6, "expected several parameters");
    // First, a middle and the last parameter tensor; two elements each.
    let picks = [0, list.0.len() / 2, list.0.len() - 1];
    let h = 1e-2f32;
    let mut checked = 0;
    for &pi in &picks {
        let (id, n) = list.0[pi];
        for j in [0, n / 2] {
            let mut at = GradAt {
                id,
                j,
                grads: &grads,
                out: None,
            };
            policy.model.visit(&mut at);
            let analytic = at.out.unwrap();
            let eval = |delta: f32| -> f32 {
                let model: PolicyModel<AD> =
                    policy.model.clone().map(&mut Perturb { id, j, delta });
                to_vec(total(&policy.with_model(model)))[0]
            };
            let numeric = (eval(h) - eval(-h)) / (2.0 * h);
            let tol = 2e-3 + 2e-2 * analytic.abs().max(numeric.abs());
            assert!(
                (analytic - numeric).abs() < tol,
                "param #{pi} element {j}: autodiff {analytic} vs finite differences {numeric}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 6);
}
