"""LSGD-PFL (spec UNIFIED.md 2.1, Algorithm 1): local SGD on both blocks, w averaged
every tau iterations.

Each device m starts a round from the server's w (w_m = w) and takes tau steps on one
example j at a time:
    w_m    <- w_m    - eta (1/M) grad_w    f_{m,j}(w_m, beta_m)
    beta_m <- beta_m - eta (1/M) grad_beta f_{m,j}(w_m, beta_m)
(eta on the gradient of (1/M) f_m, the device's share of F, as the reference applies
it); the round's communication sets w = (1/M) sum_m w_m. With tau = 1 this is SGD on F;
without a local block (`fl`) it is FedAvg with full participation and a server rate 1.
With partial participation (r of M) the round's cohort runs its tau steps, w is the
cohort's mean (unbiased for the mean over all devices) and the others' beta wait.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_pflego.unified import sampling
from tff_pflego.unified.objectives import DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm, compose


def build(objective: Objective, data: DeviceData, config: OptimizerConfig
          ) -> UnifiedAlgorithm:
  m, n, seed = objective.num_devices, data.num_examples, config.seed
  local_steps = config.local_steps
  eta = config.params.eta if config.lsgd_lr is None else config.lsgd_lr

  def client(broadcast, data, state):
    round_num, device = broadcast["schedule"]["round"], state["device"]
    index = sampling.example_indices(seed, round_num, device, local_steps, n)

    def iteration(k, w, beta):
      j = index[k]
      g_w, g_beta = objective.device_gradients(w, beta, data["x"][j:j + 1],
                                               data["y"][j:j + 1])
      return k + 1, w - (eta / m) * g_w, beta - (eta / m) * g_beta

    _, w, beta = tf.while_loop(lambda k, *_: k < local_steps, iteration,
                               (tf.constant(0), broadcast["w"]["y"],
                                state["beta"]["y"]))
    counts = collections.OrderedDict(w_gradients=tf.constant(local_steps),
                                     beta_gradients=tf.constant(local_steps))
    return (collections.OrderedDict(model=w),
            collections.OrderedDict(device=device, beta=collections.OrderedDict(y=beta)),
            counts)

  def server(w_state, schedule, mean_update):
    del w_state, schedule
    return collections.OrderedDict(y=mean_update["model"])

  def schedule(round_num):
    del round_num
    return dict(local_steps=tf.constant(local_steps))

  return compose("lsgd_pfl", objective,
                 collections.OrderedDict(y=np.zeros(objective.global_dim)),
                 collections.OrderedDict(y=np.zeros(objective.local_dim)),
                 schedule, client, server, data, config.devices_per_round, seed)
