"""`ClientFiles`: a client's file found from its id in the graph, the same data as the
library's table lookup, and a client computation whose size does not grow with I."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.data.federated import ClientFiles


def _write_clients(directory, ids, name_of) -> dict[str, str]:
  """One TFRecord file per client holding its id's integer value `int(id)` times."""
  files = {}
  for cid in ids:
    path = str(directory / name_of(cid))
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(int(cid) % 5 + 1):
        writer.write(cid.encode())
    files[cid] = path
  return files


def _read(paths):
  return tf.data.TFRecordDataset(paths).batch(100)


def _records(data: ClientFiles, cid: str) -> list[bytes]:
  """What the in-graph dataset function (the one TFF's client computations trace) reads."""
  return [r for batch in data.serializable_dataset_fn(tf.constant(cid))
          for r in batch.numpy()]


def test_id_in_the_path_reads_each_clients_own_file(tmp_path):
  # The id's digits also stand in the shard suffix ("-00000-of-00001"): only the place
  # that fits every client may be taken for the id.
  ids = [f"{i:05d}" for i in range(12)]
  files = _write_clients(tmp_path, ids,
                         lambda cid: f"clients-client{cid}_train.tfrecord-00000-of-00001")
  data = ClientFiles(files, _read)
  for cid in ids:
    want = [cid.encode()] * (int(cid) % 5 + 1)
    assert _records(data, cid) == want
    assert [r for b in data.create_tf_dataset_for_client(cid) for r in b.numpy()] == want


def test_paths_without_a_common_form_fall_back_to_the_librarys_lookup(tmp_path):
  ids = ["3", "11", "7"]
  names = {"3": "a_3.rec", "11": "zz11", "7": "other_7_x.rec"}
  data = ClientFiles(_write_clients(tmp_path, ids, names.get), _read)
  library = tff.simulation.datasets.FilePerUserClientData(
      {cid: str(tmp_path / names[cid]) for cid in ids}, _read)
  for cid in ids:
    want = [r for b in library.serializable_dataset_fn(tf.constant(cid)) for r in b.numpy()]
    assert _records(data, cid) == want == [cid.encode()] * (int(cid) % 5 + 1)


def test_client_computation_does_not_grow_with_the_population(tmp_path):
  from tensorflow_federated.python.core.impl.computation import computation_impl

  def size(num_clients: int, cls) -> int:
    ids = [f"{i:05d}" for i in range(num_clients)]
    files = {cid: str(tmp_path / f"c{cid}.rec") for cid in ids}
    for path in list(files.values())[:1]:
      with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"x")
    data = cls(files, _read)
    return computation_impl.ConcreteComputation.get_proto(
        data.dataset_computation).ByteSize()

  assert size(2000, ClientFiles) == size(10, ClientFiles)
  library = tff.simulation.datasets.FilePerUserClientData
  assert size(2000, library) > size(10, library) + 2000 * 10  # what ClientFiles avoids
