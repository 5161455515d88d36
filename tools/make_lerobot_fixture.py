"""Writes assets/testdata/lerobot_v3_fixture/: a tiny dataset laid out and typed the way
LeRobot v3.0's writer (HF datasets + pyarrow) lays out lerobot/pusht: a 2-d agent-position
state, HF feature metadata, list-typed state column as in converted v2.1 datasets, extra
columns the reader must skip (an image path string). diffrl's reader must load it.

Usage:
  $(tools/venv.sh check) tools/make_lerobot_fixture.py
"""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

root = Path("assets/testdata/lerobot_v3_fixture")
rng = np.random.default_rng(0)
lengths = [4, 3]
rows = {k: [] for k in ["observation.state", "action", "episode_index", "frame_index", "timestamp",
                        "next.reward", "next.done", "next.success", "index", "task_index", "observation.image.path"]}
i = 0
for e, n in enumerate(lengths):
    for t in range(n):
        rows["observation.state"].append([float(x) for x in rng.uniform(0, 512, 2).astype(np.float32)])
        rows["action"].append([float(x) for x in rng.uniform(0, 512, 2).astype(np.float32)])
        rows["episode_index"].append(e)
        rows["frame_index"].append(t)
        rows["timestamp"].append(t / 10)
        rows["next.reward"].append(float(t) / 10)
        rows["next.done"].append(t == n - 1)
        rows["next.success"].append(False)
        rows["index"].append(i)
        rows["task_index"].append(0)
        rows["observation.image.path"].append(f"frame_{i:06d}.png")
        i += 1
schema = pa.schema([
    ("observation.state", pa.list_(pa.float32())),
    ("action", pa.list_(pa.float32(), 2)),
    ("episode_index", pa.int64()), ("frame_index", pa.int64()), ("timestamp", pa.float32()),
    ("next.reward", pa.float32()), ("next.done", pa.bool_()), ("next.success", pa.bool_()),
    ("index", pa.int64()), ("task_index", pa.int64()), ("observation.image.path", pa.string()),
], metadata={"huggingface": json.dumps({"info": {"features": {
    "observation.state": {"feature": {"dtype": "float32", "_type": "Value"}, "_type": "Sequence"},
    "action": {"feature": {"dtype": "float32", "_type": "Value"}, "length": 2, "_type": "Sequence"}}}})})
table = pa.Table.from_pydict(rows, schema=schema)
(root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
(root / "meta").mkdir(parents=True, exist_ok=True)
pq.write_table(table, root / "data/chunk-000/file-000.parquet")
import pandas as pd  # noqa: E402
pd.DataFrame({"task_index": [0]}, index=pd.Index(["Push the T-shaped block onto the T-shaped target."], name="task")).to_parquet(root / "meta/tasks.parquet")
info = {"codebase_version": "v3.0", "robot_type": "2d pointer", "total_episodes": 2, "total_frames": i, "total_tasks": 1,
        "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500, "fps": 10,
        "splits": {"train": "0:2"}, "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {"observation.state": {"dtype": "float32", "shape": [2], "names": {"motors": ["x", "y"]}},
                     "action": {"dtype": "float32", "shape": [2], "names": {"motors": ["x", "y"]}}}}
(root / "meta/info.json").write_text(json.dumps(info, indent=2))
print("wrote", root)
