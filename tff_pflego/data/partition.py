"""Splitting a centralized dataset into personalized clients (paper, App. A.2).

Class-based partition (MNIST, Fashion-MNIST, EMNIST-Letters, CIFAR-10):
  1. every client i gets a set S_i of K classes (K = 2 / C/2 / C for High / Medium / No
     personalization). Sets are drawn so that classes stay balanced: client after client,
     take the K classes held by the fewest clients so far, ties broken at random;
  2. for every class c, its examples are shuffled and dealt one at a time, round-robin,
     to the clients holding c (in a random rotation of client order);
  3. the test split is dealt the same way with the same class sets;
  4. labels are re-indexed per client: the j-th smallest class of S_i becomes label j.

  Step 1 can instead draw each client's K classes uniformly without replacement,
  independently of the other clients (`class_assignment="independent"`, the paper's
  reference code); some classes are then held by more clients than others.

Dirichlet partition (any class dataset; the split most pFL libraries offer): for every
class c, proportions p_c ~ Dirichlet(alpha 1_I) over the clients; c's shuffled train
examples are cut in those proportions. A client's classes are the ones it got train
examples of; the test split of c is cut in the same proportions renormalized over those
holders, so each client's test labels follow its train labels. Labels are re-indexed as
above (K_i varies by client). Drawn again until every client has at least
`DIRICHLET_MIN_TRAIN` train and one test example.

Alphabet partition (Omniglot): client i holds alphabet i; every character is a class
(K_i = characters of the alphabet); each character's drawings are shuffled and split
75% / 25% into train / test.

A partition can also be read from a manifest written by an earlier run or another tool
(`ClientPartition.from_json`), checked against the dataset (`check_fits`).

Everything is a deterministic function of the labels and the seed.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tff_pflego.errors import UserError

PERSONALIZATION_DEGREES = ("high", "medium", "none")
PARTITIONS = ("classes", "dirichlet")  # by classes (or Omniglot's alphabets), Dirichlet
CLASS_ASSIGNMENTS = ("balanced", "independent")
DIRICHLET_MIN_TRAIN = 10  # train examples every client gets (as NIID-Bench requires)
DIRICHLET_ATTEMPTS = 1000


def classes_per_client(personalization: str, num_classes: int) -> int:
  """K for a degree of personalization: 2 (high), C/2 (medium), C (none)."""
  if personalization == "high":
    return 2
  if personalization == "medium":
    return num_classes // 2
  if personalization == "none":
    return num_classes
  raise UserError(f"unknown personalization {personalization!r}; "
                  f"choose one of {', '.join(PERSONALIZATION_DEGREES)}")


@dataclasses.dataclass(frozen=True)
class ClientPartition:
  """Which examples each client holds and how its labels are re-indexed.

  `class_sets[i]` holds client i's global class ids, sorted; the local label of an
  example of class c is the position of c in `class_sets[i]`. `train_indices[i]` and
  `test_indices[i]` index into the `train_source` and `test_source` splits.
  """
  class_sets: list[np.ndarray]
  train_indices: list[np.ndarray]
  test_indices: list[np.ndarray]
  train_source: str = "train"
  test_source: str = "test"

  @property
  def num_clients(self) -> int:
    return len(self.class_sets)

  def local_labels(self, client: int, global_labels: np.ndarray) -> np.ndarray:
    """Maps global labels of client `client`'s examples to 0..K_i-1."""
    positions = np.searchsorted(self.class_sets[client], global_labels)
    if np.any(self.class_sets[client][np.minimum(positions, len(
        self.class_sets[client]) - 1)] != global_labels):
      raise ValueError(f"client {client} got an example of a class it does not hold")
    return positions.astype(np.int64)

  def to_json(self) -> dict:
    return {
        "train_source": self.train_source,
        "test_source": self.test_source,
        "clients": [{
            "client": i,
            "classes": self.class_sets[i].tolist(),
            "num_train": int(len(self.train_indices[i])),
            "num_test": int(len(self.test_indices[i])),
            "train_indices": self.train_indices[i].tolist(),
            "test_indices": self.test_indices[i].tolist(),
        } for i in range(self.num_clients)],
    }

  @classmethod
  def from_json(cls, manifest: dict) -> "ClientPartition":
    """The partition of a manifest (`to_json`'s format); raises UserError naming what
    is missing or malformed. `train_source` / `test_source` default to train / test."""
    clients = manifest.get("clients") if isinstance(manifest, dict) else None
    if not isinstance(clients, list) or not clients:
      raise UserError("the manifest has no list of clients")

    def as_array(i: int, key: str) -> np.ndarray:
      value = clients[i].get(key) if isinstance(clients[i], dict) else None
      try:
        array = np.asarray(value, np.int64)
      except (TypeError, ValueError, OverflowError):
        array = None
      if array is None or array.ndim != 1:
        raise UserError(f"client {i} of the manifest has no list of integers {key!r}")
      return array

    arrays = {key: [as_array(i, key) for i in range(len(clients))]
              for key in ("classes", "train_indices", "test_indices")}
    return cls(class_sets=arrays["classes"], train_indices=arrays["train_indices"],
               test_indices=arrays["test_indices"],
               train_source=manifest.get("train_source", "train"),
               test_source=manifest.get("test_source", "test"))

  def check_fits(self, labels: dict[str, np.ndarray], num_classes: int) -> None:
    """Raises UserError if this partition cannot be served from a dataset whose splits
    have `labels` (split name -> global labels): a source split it lacks, an index out
    of range, a class out of range or listed twice, an example of a class its client
    does not hold, a client without train or test examples."""
    for part, source in (("train", self.train_source), ("test", self.test_source)):
      if source not in labels:
        raise UserError(f"the manifest's {part} examples come from split {source!r}; "
                        f"the dataset has {', '.join(sorted(labels))}")
    for i in range(self.num_clients):
      classes = self.class_sets[i]
      if np.any(classes < 0) or np.any(classes >= num_classes):
        raise UserError(f"client {i} of the manifest holds class "
                        f"{int(classes[(classes < 0) | (classes >= num_classes)][0])}; "
                        f"the dataset's classes are 0..{num_classes - 1}")
      if len(np.unique(classes)) != len(classes) or np.any(np.diff(classes) < 0):
        raise UserError(f"client {i} of the manifest lists its classes unsorted or twice")
      for part, indices, source in (("train", self.train_indices[i], self.train_source),
                                    ("test", self.test_indices[i], self.test_source)):
        if len(indices) == 0:
          raise UserError(f"client {i} of the manifest has no {part} examples")
        size = len(labels[source])
        outside = indices[(indices < 0) | (indices >= size)]
        if len(outside):
          raise UserError(f"client {i} of the manifest has {part} index {int(outside[0])}, "
                          f"outside split {source!r} (0..{size - 1})")
        foreign = np.setdiff1d(labels[source][indices], classes)
        if len(foreign):
          raise UserError(f"client {i} of the manifest has a {part} example of class "
                          f"{int(foreign[0])}, which it does not hold "
                          f"(classes {classes.tolist()})")

def assign_class_sets(num_classes: int, num_clients: int, k: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
  """Draws a K-class set per client, keeping the number of holders per class balanced."""
  holders = np.zeros(num_classes, np.int64)
  sets = []
  for _ in range(num_clients):
    tie_break = rng.permutation(num_classes)
    order = np.lexsort((tie_break, holders))  # fewest holders first, random ties
    chosen = np.sort(order[:k])
    holders[chosen] += 1
    sets.append(chosen)
  return sets


def assign_class_sets_independently(num_classes: int, num_clients: int, k: int,
                                    rng: np.random.Generator) -> list[np.ndarray]:
  """Each client draws K classes uniformly without replacement, independently of the
  others (the reference code's `choice(C, K, replace=False)` per client).

  If a class ends up held by nobody, the first ceil(C / K) clients' sets are replaced,
  as the reference code does, by consecutive K-blocks of one random permutation of the
  classes (the last block completed with classes drawn from the rest), so every class
  is held. Needs I * K >= C (`check_class_cover`).
  """
  sets = [np.sort(rng.choice(num_classes, k, replace=False)) for _ in range(num_clients)]
  if len(np.unique(np.concatenate(sets))) < num_classes:
    order = rng.permutation(num_classes)
    for j in range(-(-num_classes // k)):
      block = order[j * k:(j + 1) * k]
      rest = np.setdiff1d(np.arange(num_classes), block)
      fill = rng.choice(rest, k - len(block), replace=False)
      sets[j] = np.sort(np.concatenate([block, fill]))
  return sets


def deal_round_robin(labels: np.ndarray, class_sets: Sequence[np.ndarray],
                     rng: np.random.Generator) -> list[np.ndarray]:
  """Deals every class's shuffled examples round-robin to the clients holding it."""
  dealt: list[list[np.ndarray]] = [[] for _ in class_sets]
  for c in np.unique(labels):
    holders = [i for i, s in enumerate(class_sets) if c in s]
    if not holders:
      continue
    holders = np.roll(holders, -int(rng.integers(len(holders))))
    examples = rng.permutation(np.flatnonzero(labels == c))
    for position, client in enumerate(holders):
      dealt[client].append(examples[position::len(holders)])
  return [np.sort(np.concatenate(d)) if d else np.zeros(0, np.int64) for d in dealt]


def check_class_cover(num_clients: int, k: int, num_classes: int) -> None:
  """The class partition needs 1 <= K <= C and I * K >= C (every class held)."""
  if not 1 <= k <= num_classes:
    raise UserError(f"classes per client must be in 1..{num_classes}, got {k}")
  if num_clients * k < num_classes:
    raise UserError(f"{num_clients} clients x {k} classes cannot cover "
                    f"{num_classes} classes; use at least {-(-num_classes // k)} clients")


def check_alphabet_count(num_clients: int, num_alphabets: int) -> None:
  """Omniglot's partition gives each client one alphabet."""
  if not 1 <= num_clients <= num_alphabets:
    raise UserError(f"Omniglot has {num_alphabets} alphabets, one per client; "
                    f"num_clients must be in 1..{num_alphabets}, got {num_clients}")


def partition_by_classes(train_labels: np.ndarray, test_labels: np.ndarray,
                         num_clients: int, k: int, seed: int,
                         class_assignment: str = "balanced") -> ClientPartition:
  """The paper's class-based partition of a train and a test split (module doc)."""
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  check_class_cover(num_clients, k, num_classes)
  rng = np.random.default_rng(seed)
  if class_assignment == "balanced":
    class_sets = assign_class_sets(num_classes, num_clients, k, rng)
  elif class_assignment == "independent":
    class_sets = assign_class_sets_independently(num_classes, num_clients, k, rng)
  else:
    raise UserError(f"class_assignment must be one of {', '.join(CLASS_ASSIGNMENTS)}, "
                    f"got {class_assignment!r}")
  train = deal_round_robin(train_labels, class_sets, rng)
  test = deal_round_robin(test_labels, class_sets, rng)
  _check_nonempty(train, "train")
  _check_nonempty(test, "test")
  return ClientPartition(class_sets, train, test)


def deal_by_proportions(labels: np.ndarray, proportions: np.ndarray,
                        rng: np.random.Generator) -> list[np.ndarray]:
  """Cuts every class c's shuffled examples among the clients in the proportions
  `proportions[c]` (a row per class, summing to 1; cut points rounded down)."""
  num_clients = proportions.shape[1]
  dealt: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in np.unique(labels):
    examples = rng.permutation(np.flatnonzero(labels == c))
    cuts = np.floor(np.cumsum(proportions[c])[:-1] * len(examples)).astype(np.int64)
    for client, share in enumerate(np.split(examples, cuts)):
      dealt[client].append(share)
  return [np.sort(np.concatenate(d)) if d else np.zeros(0, np.int64) for d in dealt]


def partition_by_dirichlet(train_labels: np.ndarray, test_labels: np.ndarray,
                           num_clients: int, alpha: float, seed: int) -> ClientPartition:
  """Dirichlet label partition (module doc); raises UserError when no draw in
  `DIRICHLET_ATTEMPTS` gives every client enough examples."""
  if alpha <= 0:
    raise UserError(f"dirichlet_alpha must be > 0, got {alpha}")
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  if num_clients * DIRICHLET_MIN_TRAIN > len(train_labels):
    raise UserError(f"{num_clients} clients x {DIRICHLET_MIN_TRAIN} train examples "
                    f"exceed the {len(train_labels)} examples; use fewer clients")
  rng = np.random.default_rng(seed)
  for _ in range(DIRICHLET_ATTEMPTS):
    proportions = rng.dirichlet(np.full(num_clients, alpha), size=num_classes)
    train = deal_by_proportions(train_labels, proportions, rng)
    if min(len(t) for t in train) < DIRICHLET_MIN_TRAIN:
      continue
    class_sets = [np.unique(train_labels[t]) for t in train]
    holds = np.zeros((num_classes, num_clients), bool)
    for i, classes in enumerate(class_sets):
      holds[classes, i] = True
    held = np.where(holds, proportions, 0.0)
    held /= np.maximum(held.sum(axis=1, keepdims=True), np.finfo(float).tiny)
    test = deal_by_proportions(test_labels, held, rng)
    if min(len(t) for t in test) >= 1:
      return ClientPartition(class_sets, train, test)
  raise UserError(f"no Dirichlet(alpha={alpha}) draw in {DIRICHLET_ATTEMPTS} gave each of "
                  f"{num_clients} clients {DIRICHLET_MIN_TRAIN} train and 1 test examples; "
                  "raise --dirichlet_alpha or use fewer clients")


def partition_by_alphabet(labels: np.ndarray, alphabets: np.ndarray, num_clients: int,
                          seed: int, train_fraction: float = 0.75,
                          source: str = "drawings") -> ClientPartition:
  """Omniglot: client i holds alphabet i, each character split 75/25 train/test."""
  check_alphabet_count(num_clients, int(alphabets.max()) + 1)
  rng = np.random.default_rng(seed)
  class_sets, train, test = [], [], []
  for alphabet in range(num_clients):
    characters = np.unique(labels[alphabets == alphabet])
    client_train, client_test = [], []
    for character in characters:
      drawings = rng.permutation(np.flatnonzero(labels == character))
      cut = int(round(train_fraction * len(drawings)))
      client_train.append(drawings[:cut])
      client_test.append(drawings[cut:])
    class_sets.append(characters)
    train.append(np.sort(np.concatenate(client_train)))
    test.append(np.sort(np.concatenate(client_test)))
  return ClientPartition(class_sets, train, test, train_source=source, test_source=source)


def _check_nonempty(indices: list[np.ndarray], split: str) -> None:
  empty = [i for i, idx in enumerate(indices) if len(idx) == 0]
  if empty:
    raise UserError(f"clients {empty[:5]} get no {split} examples; use fewer clients")
