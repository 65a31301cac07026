"""The raw-data readers and the client sampler, against values known independently."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from tests import helpers
from tff_pflego import files
from tff_pflego.data import builders, sources
from tff_pflego.training.sampling import ClientSampler

OMNIGLOT_RANGES = os.path.join(sources.DEFAULT_RAW_DATA_DIR, "omniglot",
                               "alphabet_id_ranges.txt")


def test_idx_files_read_back_what_was_written(tmp_path):
  array = np.random.default_rng(0).integers(0, 256, (7, 5, 3)).astype(np.uint8)
  path = str(tmp_path / "a-idx3-ubyte.gz")
  helpers.write_idx_gz(path, array)
  np.testing.assert_array_equal(builders.read_idx(path), array)
  plain = str(tmp_path / "a-idx3-ubyte")  # not gzipped
  with gzip.open(path, "rb") as f, open(plain, "wb") as g:
    g.write(f.read())
  np.testing.assert_array_equal(builders.read_idx(plain), array)


def test_idx_files_that_are_truncated_or_not_idx_are_refused(tmp_path):
  path = str(tmp_path / "a.gz")
  helpers.write_idx_gz(path, np.zeros((4, 4), np.uint8))
  with gzip.open(path, "rb") as f:
    data = f.read()
  with gzip.open(path, "wb") as f:
    f.write(data[:-3])
  with pytest.raises(ValueError, match="header says 16 bytes of data, file has 13"):
    builders.read_idx(path)
  with gzip.open(path, "wb") as f:
    f.write(b"\x00\x00\x0d\x02" + data[4:])  # 0x0d: float data, not unsigned bytes
  with pytest.raises(ValueError, match="not an unsigned-byte IDX file"):
    builders.read_idx(path)


def test_alphabet_ranges_parse_comments_and_section_names(tmp_path):
  path = tmp_path / "ranges.txt"
  path.write_text("# Omniglot\nbackground: 0001-0026 Arcadian; 0027-0067 Armenian;\n"
                  "evaluation: 0068-0093 Old Church Slavonic (Cyrillic)  # last\n")
  assert builders.parse_alphabet_ranges(str(path)) == [
      ("Arcadian", 1, 26), ("Armenian", 27, 67), ("Old Church Slavonic (Cyrillic)", 68, 93)]
  path.write_text("# nothing\n")
  with pytest.raises(ValueError, match="holds no alphabet id ranges"):
    builders.parse_alphabet_ranges(str(path))


def test_the_shared_omniglot_ranges_are_50_alphabets_covering_1623_characters():
  ranges = builders.parse_alphabet_ranges(OMNIGLOT_RANGES)
  assert len(ranges) == 50
  assert ranges[0][1] == 1 and ranges[-1][2] == 1623
  assert all(a[2] + 1 == b[1] for a, b in zip(ranges, ranges[1:]))  # contiguous


def test_omniglot_drawings_are_inverted_resized_and_labelled(tmp_path):
  """105x105 drawings (True = paper) -> 28x28 ink in 0..255. Area resizing keeps the
  mean ink, so a drawing with ink on one side keeps its share of ink on that side."""
  paper = np.ones((105, 105), bool)
  ink_left = paper.copy()
  ink_left[:, :42] = False  # 40 % ink, the left 42 columns
  drawings = np.stack([np.zeros_like(paper), paper, ink_left] + [paper] * 17)
  manual = tmp_path / "manual"
  manual.mkdir()
  np.savez(manual / "images_background.npz", images=drawings[None])  # 1 character
  np.savez(manual / "images_evaluation.npz", images=np.stack([drawings, drawings]))
  (manual / "alphabet_id_ranges.txt").write_text("0001-0002 A; 0003-0003 B\n")
  with files.scratch_tempdir():  # TFDS leaves a tmp*tfds directory per new builder
    builder = builders.OmniglotArrays(data_dir=str(tmp_path / "tfds"))
  examples = dict(builder._generate_examples(str(manual)))  # pylint: disable=protected-access
  assert len(examples) == 3 * 20
  np.testing.assert_array_equal(examples["0_0"]["image"], 255)  # all ink
  np.testing.assert_array_equal(examples["0_1"]["image"], 0)  # blank paper
  half = examples["0_2"]["image"][..., 0].astype(float)
  assert abs(half.mean() - 0.4 * 255) < 1.0
  np.testing.assert_array_equal(half[:, :11], 255)  # 42 / 3.75 = 11.2 columns of ink
  np.testing.assert_array_equal(half[:, 12:], 0)
  assert [examples[f"{c}_0"]["alphabet"] for c in range(3)] == [0, 0, 1]
  assert [examples[f"{c}_5"]["label"] for c in range(3)] == [0, 1, 2]


def test_binomial_participation_matches_its_distribution():
  """Each client takes part with probability pi, independently: over 4000 rounds the
  count per round has mean I pi and variance I pi (1 - pi), and every client's rate
  is pi (bounds: 5 standard errors)."""
  num_clients, pi, rounds = 50, 0.3, 4000
  sampler = ClientSampler(num_clients, participation_prob=pi, seed=3)
  taken = np.zeros((rounds, num_clients), bool)
  for t in range(rounds):
    taken[t, sampler.sample()] = True
  counts = taken.sum(1)
  mean, var = num_clients * pi, num_clients * pi * (1 - pi)
  assert abs(counts.mean() - mean) < 5 * np.sqrt(var / rounds)
  assert abs(counts.var() - var) < 5 * var * np.sqrt(2 / rounds)
  rates = taken.mean(0)
  assert np.all(np.abs(rates - pi) < 5 * np.sqrt(pi * (1 - pi) / rounds))
  assert sampler.participation_prob == pi


def test_dropout_thins_participation_and_the_state_replays_the_draws():
  sampler = ClientSampler(40, clients_per_round=10, dropout_prob=0.25, seed=1)
  assert sampler.participation_prob == pytest.approx(10 / 40 * 0.75)
  reported = [len(sampler.sample()) for _ in range(2000)]
  assert abs(np.mean(reported) - 7.5) < 5 * np.sqrt(10 * 0.25 * 0.75 / 2000)
  saved = sampler.state
  ahead = [sampler.sample().tolist() for _ in range(5)]
  sampler.set_state(saved)
  assert [sampler.sample().tolist() for _ in range(5)] == ahead
