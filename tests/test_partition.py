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


# Independent class assignment (the reference code's) -----------------------------------

def test_independent_sets_are_the_reference_codes_draws_when_they_cover():
  # Reproduces the draws independently: numpy's choice without replacement per client.
  for seed in range(20):
    sets = p.assign_class_sets_independently(10, 30, 2, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    draws = [np.sort(rng.choice(10, 2, replace=False)) for _ in range(30)]
    if len(np.unique(np.concatenate(draws))) == 10:
      assert all(np.array_equal(a, b) for a, b in zip(sets, draws))
    else:  # the fix: the first C/K clients hold a permutation of the classes
      assert sorted(np.concatenate(sets[:5]).tolist()) == list(range(10))
      assert all(np.array_equal(a, b) for a, b in zip(sets[5:], draws[5:]))


def test_independent_holder_counts_are_binomial():
  """Holders of a class ~ Binomial(I, K/C) (before the rare cover fix): mean and
  variance over many seeds against the closed form; the balanced assignment's variance
  is ~0, so this fails if `independent` falls back to it."""
  num_classes, num_clients, k = 10, 20, 2
  counts = []
  for seed in range(400):
    sets = p.assign_class_sets_independently(num_classes, num_clients, k,
                                             np.random.default_rng(seed))
    counts.append(np.bincount(np.concatenate(sets), minlength=num_classes))
  counts = np.array(counts, float)
  q = k / num_classes
  assert abs(counts.mean() - num_clients * q) < 1e-9  # I K / C holders on average, exactly
  np.testing.assert_allclose(counts.var(), num_clients * q * (1 - q), rtol=0.1)
  assert np.all(counts >= 1)  # every class held


def test_partition_by_classes_with_independent_assignment():
  train, test = labels(10, 60, 0), labels(10, 10, 1)
  part = p.partition_by_classes(train, test, 8, 2, seed=0, class_assignment="independent")
  for i in range(8):
    assert set(train[part.train_indices[i]].tolist()) <= set(part.class_sets[i].tolist())
  flat = np.concatenate(part.train_indices)
  assert len(flat) == len(set(flat.tolist())) == len(train)
  with pytest.raises(UserError, match="class_assignment must be one of"):
    p.partition_by_classes(train, test, 8, 2, seed=0, class_assignment="greedy")


# Dirichlet -------------------------------------------------------------------------------

def test_dirichlet_partition_covers_the_data_and_keeps_test_labels_within_train():
  train, test = labels(10, 300, 0), labels(10, 60, 1)
  part = p.partition_by_dirichlet(train, test, 12, 0.3, seed=2)
  for split, indices in ((train, part.train_indices), (test, part.test_indices)):
    flat = np.concatenate(indices)
    assert len(flat) == len(set(flat.tolist())) == len(split)  # disjoint, complete
  for i in range(12):
    assert len(part.train_indices[i]) >= p.DIRICHLET_MIN_TRAIN
    assert len(part.test_indices[i]) >= 1
    assert np.array_equal(part.class_sets[i], np.unique(train[part.train_indices[i]]))
    local = part.local_labels(i, test[part.test_indices[i]])  # raises if not held
    assert local.max() < len(part.class_sets[i])
  assert len({len(s) for s in part.class_sets}) > 1  # K_i varies at small alpha
  again = p.partition_by_dirichlet(train, test, 12, 0.3, seed=2)
  assert all(np.array_equal(a, b) for a, b in zip(part.train_indices, again.train_indices))


@pytest.mark.parametrize("alpha", [0.5, 5.0])
def test_dirichlet_shares_have_the_dirichlet_variance(alpha):
  """A client's share of a class ~ Beta(alpha, (I-1) alpha): variance
  (1/I)(1 - 1/I) / (I alpha + 1), over many seeds (cuts rounded to whole examples)."""
  num_clients, per_class = 5, 2000
  train, test = labels(2, per_class, 0), labels(2, 200, 1)
  shares = []
  for seed in range(300):
    part = p.partition_by_dirichlet(train, test, num_clients, alpha, seed)
    shares += [np.sum(train[idx] == 0) / per_class for idx in part.train_indices]
  q = 1 / num_clients
  np.testing.assert_allclose(np.mean(shares), q, atol=1e-9)  # all examples dealt
  np.testing.assert_allclose(np.var(shares), q * (1 - q) / (num_clients * alpha + 1),
                             rtol=0.15)


def test_dirichlet_that_cannot_give_every_client_data_is_a_user_error():
  train, test = labels(2, 30, 0), labels(2, 5, 1)
  with pytest.raises(UserError, match="raise --dirichlet_alpha or use fewer clients"):
    p.partition_by_dirichlet(train, test, 6, 0.01, seed=0)
  with pytest.raises(UserError, match="exceed the 60 examples"):
    p.partition_by_dirichlet(train, test, 7, 1.0, seed=0)


# Manifests -------------------------------------------------------------------------------

def _manifest():
  train, test = labels(4, 10, 0), labels(4, 4, 1)
  part = p.partition_by_classes(train, test, 4, 2, seed=0)
  return part.to_json(), {"train": train, "test": test}


def test_a_manifest_round_trips_and_fits_its_data():
  manifest, split_labels = _manifest()
  part = p.ClientPartition.from_json(manifest)
  part.check_fits(split_labels, 4)
  assert part.to_json() == manifest


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["clients"][1]["train_indices"].append(40), "train index 40, outside"),
    (lambda m: m["clients"][2]["test_indices"].__setitem__(0, -1), "test index -1"),
    (lambda m: m["clients"][0]["classes"].pop(), "which it does not hold"),
    (lambda m: m["clients"][3].__setitem__("test_indices", []), "client 3 of the manifest "
                                                                 "has no test examples"),
    (lambda m: m["clients"][0]["classes"].append(9), "holds class 9"),
    (lambda m: m["clients"][0]["classes"].reverse(), "unsorted or twice"),
    (lambda m: m.__setitem__("train_source", "drawings"), "split 'drawings'"),
])
def test_a_manifest_that_does_not_fit_the_data_is_one_clear_error(edit, message):
  manifest, split_labels = _manifest()
  edit(manifest)
  with pytest.raises(UserError, match=message):
    p.ClientPartition.from_json(manifest).check_fits(split_labels, 4)


@pytest.mark.parametrize("manifest,message", [
    ({}, "no list of clients"), ({"clients": []}, "no list of clients"),
    ({"clients": [{"classes": [0]}]}, "no list of integers 'train_indices'"),
    ({"clients": [{"classes": "x", "train_indices": [], "test_indices": []}]},
     "no list of integers 'classes'"),
])
def test_a_malformed_manifest_is_one_clear_error(manifest, message):
  with pytest.raises(UserError, match=message):
    p.ClientPartition.from_json(manifest)
