"""The paper's partition (App. A.2) and Omniglot's alphabet partition."""

from __future__ import annotations

import numpy as np
import pytest

from tff_pflego.data import partition as p
from tff_pflego.errors import UserError


def labels(num_classes, per_class, seed):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


@pytest.mark.parametrize("degree,k", [("high", 2), ("medium", 5), ("none", 10)])
def test_class_sets_examples_and_labels(degree, k):
  train, test = labels(10, 600, 0), labels(10, 100, 1)
  assert p.classes_per_client(degree, 10) == k
  part = p.partition_by_classes(train, test, 20, k, seed=3)
  holders = np.zeros(10, int)
  for i in range(20):
    assert len(part.class_sets[i]) == k == len(set(part.class_sets[i].tolist()))
    holders[part.class_sets[i]] += 1
    for idx, split in ((part.train_indices[i], train), (part.test_indices[i], test)):
      assert set(split[idx].tolist()) == set(part.class_sets[i].tolist())  # same sets
      local = part.local_labels(i, split[idx])
      assert local.min() == 0 and local.max() == k - 1
  assert holders.max() - holders.min() <= 1  # classes held by balanced numbers of clients
  for split, indices in ((train, part.train_indices), (test, part.test_indices)):
    flat = np.concatenate(indices)
    assert len(flat) == len(set(flat.tolist())) == len(split)  # disjoint, complete
    for c in range(10):  # round-robin: holders of c get equal shares, +-1
      shares = [np.sum(split[idx] == c) for i, idx in enumerate(indices)
                if c in part.class_sets[i]]
      assert max(shares) - min(shares) <= 1 and sum(shares) == np.sum(split == c)


def test_partition_is_deterministic_for_a_seed():
  train, test = labels(10, 50, 0), labels(10, 10, 1)
  a = p.partition_by_classes(train, test, 8, 2, seed=5)
  b = p.partition_by_classes(train, test, 8, 2, seed=5)
  c = p.partition_by_classes(train, test, 8, 2, seed=6)
  assert a.to_json() == b.to_json() and a.to_json() != c.to_json()
  assert p.ClientPartition.from_json(a.to_json()).to_json() == a.to_json()


def test_too_many_clients_for_the_data_is_a_user_error():
  with pytest.raises(UserError, match="no train examples"):
    p.partition_by_classes(labels(2, 3, 0), labels(2, 3, 1), 10, 2, seed=0)
  with pytest.raises(UserError, match="unknown personalization"):
    p.classes_per_client("extreme", 10)


def test_alphabet_partition_splits_every_character_75_25():
  characters = np.repeat(np.arange(12), 20)
  alphabets = characters // 4  # 3 alphabets of 4 characters
  part = p.partition_by_alphabet(characters, alphabets, 3, seed=0)
  for i in range(3):
    assert part.class_sets[i].tolist() == list(range(4 * i, 4 * i + 4))
    for c in part.class_sets[i]:
      assert np.sum(characters[part.train_indices[i]] == c) == 15
      assert np.sum(characters[part.test_indices[i]] == c) == 5
    assert not set(part.train_indices[i]) & set(part.test_indices[i])
