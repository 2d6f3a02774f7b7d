"""A program written for service_streamer 0.1.2 runs after changing only its
import."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import streamer_core
from streamer_core import ManagedModel, Streamer, ThreadedStreamer

ROOT = Path(__file__).resolve().parents[2]

# Written the way service_streamer's users write it, import line included.
SERVICE_STREAMER_PROGRAM = textwrap.dedent(
    """
    import time
    from service_streamer import ThreadedStreamer, Streamer, ManagedModel


    def predict(batch):
        time.sleep(0.005)
        return [len(s) for s in batch]


    class WordCounter(ManagedModel):
        def init_model(self, scale=1):
            self.model = scale

        def predict(self, batch):
            return [self.model * len(s.split()) for s in batch]


    if __name__ == "__main__":
        streamer = ThreadedStreamer(predict, batch_size=64, max_latency=0.1)
        print(streamer.predict(["a", "bb", "ccc"]))
        future = streamer.submit(["dddd"])
        print(future.result(timeout=5))
        streamer.destroy_workers()

        streamer = Streamer(WordCounter, batch_size=64, max_latency=0.1, worker_num=2, cuda_devices=(0,),
                            model_init_args=(10,))
        print(streamer.predict(["one two", "three"]))
        print(streamer.submit(["x y z"]).result(timeout=20))
        streamer.destroy_workers()

        streamer = Streamer(predict, 8, 0.05)
        print(streamer.predict(["abc"]))
        streamer.destroy_workers()
    """
)


def test_a_service_streamer_program_runs_after_changing_its_import(tmp_path):
    source = SERVICE_STREAMER_PROGRAM.replace("from service_streamer import", "from streamer_core import")
    assert source.count("streamer_core") == 1, "only the import line may change"
    script = tmp_path / "program.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == ["[1, 2, 3]", "[4]", "[20, 10]", "[30]", "[3]"]


def parameters(callable_) -> list:
    return [
        (p.name, p.default)
        for p in inspect.signature(callable_).parameters.values()
        if p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD)
    ]


def test_signatures_match_service_streamer():
    # service_streamer 0.1.2's positional parameters and defaults, which programs rely on.
    assert parameters(ThreadedStreamer) == [
        ("predict_function", inspect._empty),
        ("batch_size", inspect._empty),
        ("max_latency", 0.1),
    ]
    assert parameters(Streamer) == [
        ("predict_function_or_model", inspect._empty),
        ("batch_size", inspect._empty),
        ("max_latency", 0.1),
        ("worker_num", 1),
        ("cuda_devices", None),
        ("model_init_args", None),
        ("model_init_kwargs", None),
    ]
    assert parameters(ManagedModel) == [("gpu_id", None)]
    for name in ("predict", "submit", "destroy_workers"):
        assert callable(getattr(ThreadedStreamer, name)) and callable(getattr(Streamer, name))


def test_managed_model_sets_device_zero_too(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    model = ManagedModel(0)
    assert model.gpu_id == 0 and model.model is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_core_imports_no_web_framework_torch_or_redis():
    code = (
        "import sys, streamer_core, streamer_core.backends.process, streamer_core.backends.process_worker; "
        "print(sorted(m for m in ('flask', 'django', 'torch', 'redis', 'gevent') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert set(streamer_core.__all__) >= {"ThreadedStreamer", "Streamer", "ManagedModel", "StreamerError"}
