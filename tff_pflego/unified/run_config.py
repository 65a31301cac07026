"""What one unified-framework run is: its settings, their allowed values and checks.

Free of TensorFlow, so that `binaries/train_unified.py` checks a run's settings before
it loads; `experiment` builds and runs the problem.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tff_pflego.data import sources
from tff_pflego.errors import UserError
from tff_pflego.unified import registry

SYNTHETIC = ("synthetic_mx2", "synthetic_ews")  # the paper's generators (`synthetic`)
REAL = ("mnist", "fashion_mnist", "emnist_letters", "cifar10")  # `real_data`
DATASETS = SYNTHETIC + REAL
OBJECTIVES = ("fl", "local", "mt2", "mx2", "apfl2", "ews")  # `objectives.Objective`
ASCD_VARIANTS = ("frozen", "lifted")


@dataclasses.dataclass(frozen=True)
class UnifiedConfig:
  dataset: str = "synthetic_mx2"
  heterogeneity: float = 0.1  # sigma (synthetic)
  objective: Optional[str] = None  # synthetic: theirs (mx2 / ews); real data: required
  classes_per_device: int = 2  # c (real data)
  colour: bool = False  # CIFAR-10: 3072 colour features instead of 1024 grey
  ridge: Optional[float] = None  # None: 0 synthetic, experiment.REAL_DATA_RIDGE real data
  paper_mu: bool = False  # real data: the reference's heuristic mu in the parameters
  algorithm: str = "ascd_pfl"
  rounds: int = 1000  # communications
  seed: int = 0  # the optimizer's draws
  data_seed: Optional[int] = None  # None: 111 synthetic (the paper's), 0 real data
  num_devices: int = 20
  num_examples: int = 1000  # synthetic n (real data: 100 train / 300 test per device)
  reparametrize: bool = True
  p_w: Optional[float] = None  # None: the theory's calL_w / (calL_w + calL_beta)
  mt_alpha: Optional[float] = None  # MT2's alpha (relaxation); None: the paper's 1
  devices_per_round: Optional[int] = None  # partial participation; None: all M
  ascd_variant: str = "frozen"
  local_steps: int = 5  # LSGD-PFL's tau
  lsgd_lr: Optional[float] = None
  eval_every: int = 1
  output_dir: Optional[str] = None
  overwrite: bool = False  # replace a finished run in output_dir
  progress: bool = False
  data_dir: str = sources.DEFAULT_DATA_DIR
  raw_data_dir: str = sources.DEFAULT_RAW_DATA_DIR

  @property
  def synthetic(self) -> bool:
    return self.dataset in SYNTHETIC

  def check(self) -> None:
    """Raises UserError naming the first setting that is not allowed."""
    problem = self._problem()
    if problem:
      raise UserError(problem)

  def _problem(self) -> Optional[str]:
    if self.dataset not in DATASETS:
      return f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}"
    if self.synthetic:
      expected = self.dataset.split("_", 1)[-1]
      if self.objective not in (None, expected):
        return f"--objective for {self.dataset} is {expected}, got {self.objective!r}"
    elif self.objective not in tuple(k for k in OBJECTIVES if k != "ews"):
      return (f"--objective for real data must be one of fl, local, mt2, mx2, apfl2, "
              f"got {self.objective!r}")
    if self.algorithm not in registry.OPTIMIZERS:
      return (f"--algorithm must be one of {', '.join(registry.OPTIMIZERS)}, "
              f"got {self.algorithm!r}")
    if not self.heterogeneity > 0:
      return f"--heterogeneity must be > 0, got {self.heterogeneity}"
    if self.p_w is not None and not 0 < self.p_w < 1:
      return f"--p_w must be in (0, 1), got {self.p_w}"
    if self.mt_alpha is not None and not self.mt_alpha > 0:
      return f"--mt_alpha must be > 0, got {self.mt_alpha}"
    if self.mt_alpha is not None and self.objective != "mt2":
      return f"--mt_alpha applies to --objective=mt2 only, got {self.objective!r}"
    if self.devices_per_round is not None:
      if not 1 <= self.devices_per_round <= self.num_devices:
        return (f"--devices_per_round must be in 1..{self.num_devices}, "
                f"got {self.devices_per_round}")
      if self.devices_per_round < self.num_devices:
        problem = registry.partial_participation_problem(
            self.algorithm, self.ascd_variant == "frozen")
        if problem:
          return problem
    if self.ascd_variant not in ASCD_VARIANTS:
      return (f"--ascd_variant must be one of {', '.join(ASCD_VARIANTS)}, "
              f"got {self.ascd_variant!r}")
    if self.ridge is not None and self.ridge < 0:
      return f"--ridge must be >= 0, got {self.ridge}"
    for name in ("rounds", "local_steps", "eval_every", "num_devices", "num_examples",
                 "classes_per_device"):
      if getattr(self, name) < 1:
        return f"--{name} must be >= 1, got {getattr(self, name)}"
    return None


def check_output_dir(config: UnifiedConfig) -> None:
  """A run already in --output_dir is kept unless --overwrite is given."""
  if config.output_dir is None or config.overwrite:
    return
  if os.path.isfile(config.output_dir):
    raise UserError(f"--output_dir {config.output_dir} is a file, not a directory")
  for name in ("summary.json", "metrics.csv"):
    if os.path.exists(os.path.join(config.output_dir, name)):
      raise UserError(f"--output_dir {config.output_dir} already holds a run ({name}); "
                      "give another directory or --overwrite")
