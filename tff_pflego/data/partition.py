"""Splitting a centralized dataset into personalized clients (paper, App. A.2).

Class-based partition (MNIST, Fashion-MNIST, EMNIST-Letters, CIFAR-10):
  1. every client i gets a set S_i of K classes (K = 2 / C/2 / C for High / Medium / No
     personalization). Sets are drawn so that classes stay balanced: client after client,
     take the K classes held by the fewest clients so far, ties broken at random;
  2. for every class c, its examples are shuffled and dealt one at a time, round-robin,
     to the clients holding c (in a random rotation of client order);
  3. the test split is dealt the same way with the same class sets;
  4. labels are re-indexed per client: the j-th smallest class of S_i becomes label j.

Alphabet partition (Omniglot): client i holds alphabet i; every character is a class
(K_i = characters of the alphabet); each character's drawings are shuffled and split
75% / 25% into train / test.

Everything is a deterministic function of the labels and the seed.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tff_pflego.errors import UserError

PERSONALIZATION_DEGREES = ("high", "medium", "none")


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
    clients = manifest["clients"]
    as_array = lambda key: [np.asarray(c[key], np.int64) for c in clients]
    return cls(class_sets=as_array("classes"), train_indices=as_array("train_indices"),
               test_indices=as_array("test_indices"),
               train_source=manifest["train_source"], test_source=manifest["test_source"])

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
                         num_clients: int, k: int, seed: int) -> ClientPartition:
  """The paper's class-based partition of a train and a test split (module doc)."""
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  check_class_cover(num_clients, k, num_classes)
  rng = np.random.default_rng(seed)
  class_sets = assign_class_sets(num_classes, num_clients, k, rng)
  train = deal_round_robin(train_labels, class_sets, rng)
  test = deal_round_robin(test_labels, class_sets, rng)
  _check_nonempty(train, "train")
  _check_nonempty(test, "test")
  return ClientPartition(class_sets, train, test)


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
