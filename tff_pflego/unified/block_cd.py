"""Randomized block coordinate descent on F over the blocks w and beta = (beta_m)_m:
the engine of ASVRCD-PFL, ASCD-PFL, SVRCD-PFL and SCD-PFL (spec UNIFIED.md 2.3, 2.4).

Iteration k, for each block b in {w, beta} (state y, z; with variance reduction also
the reference point v and the stored full gradient G = grad F(v)):
  1. x_b = theta1 z_b + theta2 v_b + (1 - theta1 - theta2) y_b   (no momentum: x_b = y_b)
  2. draw the block xi (w w.p. p_w) and, per device, an example j; with variance
     reduction a coin c ~ Bernoulli(rho)
  3. estimate grad_b F(x):
       sampled block      g_b = (grad_b F_j(x) - grad_b F_j(v)) / p_b + G_b
                          (no variance reduction: g_b = grad_b F_j(x) / p_b)
       other block        g_b = G_b  (no variance reduction: 0)
     so E g = grad F(x) over xi and j (tests enumerate it)
  4. y_b <- x_b - eta g_b;  z_b <- nu z_b + (1 - nu) x_b + (gamma / eta)(y_b - x_b)
     With `frozen` (the reference's ASCD, defect-free but a choice: B7) the block not
     sampled keeps its y and z instead of stepping with g = 0.
  5. c = 1: v <- y^k (this iteration's starting y), G <- grad F(v) (theory's order).
Partial participation (r of M devices per round, `sampling.cohort`; without variance
reduction and with frozen or no momentum): the cohort runs the round and the others'
beta blocks are frozen as unsampled blocks are; the w estimate averages the cohort's
parts (unbiased), a cohort device's beta estimate is divided by q = r / M as well
(unbiased: P(m in cohort) = q).
With variance reduction the first communication (round 0) only computes G = grad F(0)
at the starting point v = y = z = 0: every later estimate is unbiased.

grad_w F_j(x) = (1/M) sum_m grad_w f_{m,j_m}(x) needs every device: iterations with
xi = w or c = 1 communicate, the others are local. One TFF round is one
communication: the server draws K local iterations and the kind of the communicating
one (`sampling.round_schedule`); each device runs the K local iterations and its part
of the last in one `tf.function` loop. The w block's local iterations do not depend on
any device's data (g_w = G_w or 0), so devices and server both advance it with the same
function, and only the communicating iteration's w-gradients are averaged.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional
import numpy as np
import tensorflow as tf

from tff_pflego.unified import sampling
from tff_pflego.unified.constants import StepParameters
from tff_pflego.unified.objectives import DTYPE, DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm, compose


@dataclasses.dataclass(frozen=True)
class BlockRule:
  """Steps 1, 3 and 4 of the module docstring, for one block's state dict."""
  eta: float
  p_w: float
  momentum: bool
  variance_reduced: bool
  frozen: bool = False
  theta1: float = 0.0
  theta2: float = 0.0
  gamma: float = 0.0
  nu: float = 1.0
  rho: float = 0.0
  # Multiplies the block's estimate in step 4 (a per-block step size): the w block at
  # 1/M without the reparametrization is the reparametrized run, iterate for iterate.
  gradient_scale: float = 1.0
  participation: float = 1.0  # q = r / M: a device's probability of taking part

  def keys(self) -> tuple[str, ...]:
    return ("y", "z")[:1 + self.momentum] + (("v", "g") if self.variance_reduced else ())

  def initial(self, dim: int) -> collections.OrderedDict:
    return collections.OrderedDict((k, np.zeros(dim, np.float64)) for k in self.keys())

  def point(self, state) -> tf.Tensor:
    if not self.momentum:
      return state["y"]
    theta2 = self.theta2 if self.variance_reduced else 0.0
    x = self.theta1 * state["z"] + (1.0 - self.theta1 - theta2) * state["y"]
    return x + theta2 * state["v"] if self.variance_reduced else x

  def estimate(self, gradient_x, gradient_v, state, probability: float) -> tf.Tensor:
    if not self.variance_reduced:
      return gradient_x / probability
    return (gradient_x - gradient_v) / probability + state["g"]

  def step(self, state, x, estimate) -> collections.OrderedDict:
    new = collections.OrderedDict(state)
    new["y"] = x - (self.eta * self.gradient_scale) * estimate
    if self.momentum:
      new["z"] = (self.nu * state["z"] + (1.0 - self.nu) * x
                  - (self.gamma * self.gradient_scale) * estimate)
    return new

  def unsampled(self, state, x) -> collections.OrderedDict:
    if self.variance_reduced:
      return self.step(state, x, state["g"])
    if self.frozen or not self.momentum:
      return state
    return self.step(state, x, tf.zeros_like(x))

  def refreshed(self, new, old, full_gradient) -> collections.OrderedDict:
    new = collections.OrderedDict(new)
    new["v"], new["g"] = old["y"], full_gradient
    return new


def advance_w(rule: BlockRule, w_state, local_steps: tf.Tensor):
  """The w block through K local iterations (devices and server alike)."""
  return tf.while_loop(lambda k, _: k < local_steps,
                       lambda k, s: (k + 1, rule.unsampled(s, rule.point(s))),
                       (tf.constant(0), w_state))[1]


def builder(name: str, make_rule: Callable[[StepParameters, bool], BlockRule]
            ) -> Callable[[Objective, DeviceData, OptimizerConfig], UnifiedAlgorithm]:
  """An algorithm module's `build(objective, data, config)` from its rule."""
  def build_algorithm(objective: Objective, data: DeviceData,
                      config: OptimizerConfig) -> UnifiedAlgorithm:
    rule = make_rule(config.params, config.frozen)
    r, m = config.devices_per_round, objective.num_devices
    if r is not None and r < m:  # `registry.partial_participation_problem` allows it
      rule = dataclasses.replace(rule, participation=r / m)
    return build(name, objective, rule, data, config.seed, config.w_gradient_scale,
                 r)
  return build_algorithm


def beta_estimate(rule: BlockRule, objective: Objective, w_state, b_state, x, y):
  """(x_beta, g_beta) of one device when beta is the sampled block, on example (x, y):
  grad_beta F_j = (1/M) grad_beta f_{m,j}."""
  m = objective.num_devices
  x_w, x_b = rule.point(w_state), rule.point(b_state)
  g_x = objective.block_gradient("beta", x_w, x_b, x, y) / m
  g_v = (objective.block_gradient("beta", w_state["v"], b_state["v"], x, y) / m
         if rule.variance_reduced else None)
  return x_b, rule.estimate(g_x, g_v, b_state, (1.0 - rule.p_w) * rule.participation)


def w_direction(rule: BlockRule, objective: Objective, w_state, b_state, x, y):
  """One device's part of the w estimate when w is sampled, on example (x, y); the
  estimate is `w_estimate` of the devices' mean (grad_w F_j = mean_m grad_w f_{m,j})."""
  g_x = objective.block_gradient("w", rule.point(w_state), rule.point(b_state), x, y)
  if not rule.variance_reduced:
    return g_x
  return g_x - objective.block_gradient("w", w_state["v"], b_state["v"], x, y)


def w_estimate(rule: BlockRule, w_state, mean_direction):
  return rule.estimate(mean_direction, tf.zeros_like(mean_direction), w_state, rule.p_w)


def build(name: str, objective: Objective, rule: BlockRule, data: DeviceData,
          seed: int, w_gradient_scale: float = 1.0,
          devices_per_round: Optional[int] = None) -> UnifiedAlgorithm:
  m, n = objective.num_devices, data.num_examples
  d0 = objective.global_dim
  vr = rule.variance_reduced
  w_rule = dataclasses.replace(rule, gradient_scale=w_gradient_scale)
  w_initial, beta_initial = rule.initial(d0), rule.initial(objective.local_dim)

  def client(broadcast, data, state):
    schedule, w = broadcast["schedule"], broadcast["w"]
    beta, device = state["beta"], state["device"]
    x_all, y_all = data["x"], data["y"]
    local = schedule["local_steps"]
    index = sampling.example_indices(seed, schedule["round"], device, local + 1, n)

    def example(k):
      j = index[k]
      return x_all[j:j + 1], y_all[j:j + 1]

    def beta_step(w_s, b_s, k):
      return rule.step(b_s, *beta_estimate(rule, objective, w_s, b_s, *example(k)))

    def local_iteration(k, w_s, b_s):
      return k + 1, w_rule.unsampled(w_s, rule.point(w_s)), beta_step(w_s, b_s, k)

    _, w_k, b_k = tf.while_loop(lambda k, *_: k < local, local_iteration,
                                (tf.constant(0), w, beta))

    def w_iteration():
      return (w_direction(rule, objective, w_k, b_k, *example(local)),
              rule.unsampled(b_k, rule.point(b_k)))

    def beta_iteration():
      return tf.zeros([d0], DTYPE), beta_step(w_k, b_k, local)

    def iteration():
      return tf.cond(schedule["step_w"], w_iteration, beta_iteration)

    if vr:
      direction, b_new = tf.cond(schedule["initial"],
                                 lambda: (tf.zeros([d0], DTYPE), b_k), iteration)
    else:
      direction, b_new = iteration()
    full_w = tf.zeros([d0], DTYPE)
    if vr:
      def refresh():
        g_w, g_b = objective.device_gradients(w_k["y"], b_k["y"], x_all, y_all)
        return g_w, rule.refreshed(b_new, b_k, g_b / m)
      full_w, b_new = tf.cond(schedule["refresh"], refresh, lambda: (full_w, b_new))
    per_gradient = 2 if vr else 1
    step_w = tf.cast(schedule["step_w"], tf.int32)
    refreshes = tf.cast(schedule["refresh"], tf.int32) if vr else 0
    steps = 1 - tf.cast(schedule["initial"], tf.int32) if vr else 1
    counts = collections.OrderedDict(
        w_gradients=per_gradient * step_w + n * refreshes,
        beta_gradients=per_gradient * (local + steps - step_w) + n * refreshes)
    # Only what the server needs goes up: the full gradient only with refreshes.
    update = collections.OrderedDict(direction=direction)
    if vr:
      update["full"] = full_w
    return update, collections.OrderedDict(device=device, beta=b_new), counts

  def server(state, schedule, mean_update):
    w_k = advance_w(w_rule, state, schedule["local_steps"])
    xw = rule.point(w_k)

    def w_step():
      return w_rule.step(w_k, xw, w_estimate(rule, w_k, mean_update["direction"]))

    w_new = tf.cond(schedule["step_w"], w_step, lambda: w_rule.unsampled(w_k, xw))
    if vr:
      w_new = tf.cond(schedule["initial"], lambda: w_k, lambda: w_new)
      w_new = tf.cond(schedule["refresh"],
                      lambda: rule.refreshed(w_new, w_k, mean_update["full"]),
                      lambda: w_new)
    return w_new

  def schedule(round_num):
    drawn = sampling.round_schedule(seed, round_num, rule.p_w, rule.rho, vr)
    if not vr:
      return drawn
    # Round 0 only computes G = grad F(v) at the starting point v = y = 0.
    initial = tf.equal(round_num, 0)
    return dict(local_steps=tf.where(initial, 0, drawn["local_steps"]),
                step_w=tf.logical_and(drawn["step_w"], tf.logical_not(initial)),
                refresh=tf.logical_or(drawn["refresh"], initial), initial=initial)

  return compose(name, objective, w_initial, beta_initial, schedule, client, server, data,
                 devices_per_round, seed)
