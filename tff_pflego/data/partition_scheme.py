"""How a dataset is split into clients, as the settings say, and a partition read back
from a manifest file. Free of TensorFlow: a run's partition settings and
`--partition_file` are checked before TensorFlow loads (`experiment_config.resolve`);
the client files themselves are built by `federated`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from tff_pflego.data import partition as partition_lib
from tff_pflego.data import provenance, sources
from tff_pflego.errors import UserError


@dataclasses.dataclass(frozen=True)
class PartitionScheme:
  """How a dataset is split into clients (`partition` module doc), as the settings
  `--partition`, `--class_assignment`, `--dirichlet_alpha`, `--partition_file` say.

  `partition="classes"` is the paper's class partition (Omniglot's: one alphabet per
  client); `partition_file` replays a manifest instead of drawing a partition.
  """
  partition: str = "classes"
  class_assignment: str = "balanced"
  dirichlet_alpha: float = 0.5
  partition_file: Optional[str] = None

  def check(self, spec: sources.DatasetSpec) -> None:
    """Raises UserError for a scheme `spec`'s data cannot take."""
    if self.partition not in partition_lib.PARTITIONS:
      raise UserError(f"--partition must be one of {', '.join(partition_lib.PARTITIONS)}, "
                      f"got {self.partition!r}")
    if self.class_assignment not in partition_lib.CLASS_ASSIGNMENTS:
      raise UserError(f"--class_assignment must be one of "
                      f"{', '.join(partition_lib.CLASS_ASSIGNMENTS)}, "
                      f"got {self.class_assignment!r}")
    drawn = self.partition != "classes" or self.class_assignment != "balanced"
    if self.partition_file is not None and drawn:
      raise UserError("give --partition_file or --partition / --class_assignment, "
                      "not both")
    if spec.partition == "alphabets" and drawn:
      raise UserError(f"{spec.display_name} is split one alphabet per client; "
                      "--partition and --class_assignment apply to class datasets")
    if self.partition == "dirichlet" and self.class_assignment != "balanced":
      raise UserError("--class_assignment applies to --partition=classes, not dirichlet")

  def record(self, spec: sources.DatasetSpec) -> dict:
    """What a manifest and a run's summary say about the scheme."""
    if self.partition_file is not None:
      return dict(partition="file", partition_file=os.path.abspath(self.partition_file))
    if spec.partition == "alphabets":
      return dict(partition="alphabets")
    if self.partition == "dirichlet":
      return dict(partition="dirichlet", dirichlet_alpha=self.dirichlet_alpha)
    return dict(partition="classes", class_assignment=self.class_assignment)


def read_partition_file(path: str, dataset: str) -> tuple[dict, partition_lib.ClientPartition]:
  """A manifest written by an earlier run (its `partition.json`, or the manifest under
  data_dir/partitions) or another tool in the same format, and its partition.

  Raises UserError, naming the file, if it cannot be read, is malformed, names another
  dataset, or records a fingerprint its content does not match (edited: drop
  `partition_fingerprint` to use an edited manifest as a new partition). Whether it
  fits the dataset's data is checked when its client files are built (`check_fits`).
  """
  try:
    with open(path) as f:
      manifest = json.load(f)
  except OSError as e:
    raise UserError(f"--partition_file {path}: {e.strerror}") from None
  except ValueError as e:
    raise UserError(f"--partition_file {path} is not JSON: {e}") from None
  if not isinstance(manifest, dict):
    raise UserError(f"--partition_file {path} is not a partition manifest (a JSON object)")
  if manifest.get("dataset", dataset) != dataset:
    raise UserError(f"--partition_file {path} splits {manifest['dataset']}, not {dataset}")
  recorded = manifest.get("partition_fingerprint")
  if recorded is not None and provenance.sha256_json(
      {k: v for k, v in manifest.items() if k != "partition_fingerprint"}) != recorded:
    raise UserError(f"--partition_file {path} does not match its own partition_fingerprint "
                    "(edited or damaged; remove that field to use it as a new partition)")
  try:
    return manifest, partition_lib.ClientPartition.from_json(manifest)
  except UserError as e:
    raise UserError(f"--partition_file {path}: {e}") from None


def check_partition(spec: sources.DatasetSpec, personalization: str,
                    num_clients: int, scheme: PartitionScheme = PartitionScheme()) -> None:
  """Raises UserError if `spec`'s partition cannot give `num_clients` clients at this
  degree with this scheme; needs no data (whether each client gets test examples is
  checked once the data is read)."""
  scheme.check(spec)
  if num_clients < 1:
    raise UserError(f"num_clients must be >= 1, got {num_clients}")
  if scheme.partition_file is not None or scheme.partition == "dirichlet":
    return
  if spec.partition == "classes":
    partition_lib.check_class_cover(
        num_clients, partition_lib.classes_per_client(personalization, spec.num_classes),
        spec.num_classes)
  else:
    partition_lib.check_alphabet_count(num_clients, spec.num_alphabets)
