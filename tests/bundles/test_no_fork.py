"""Opening OpenVINO and naming the server's threads start no process: OpenVINO's usage telemetry (a forked child
that calls Google Analytics on `import openvino`) is kept out, and the thread names need no library search
(`ctypes.util.find_library` runs `ldconfig -p`). A fork in a process whose gRPC and runtime threads run can hang it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    events = []
    sys.addaudithook(lambda event, args: events.append(event) if event in (
        "os.fork", "os.forkpty", "os.posix_spawn", "subprocess.Popen", "os.system") else None)
    from bundles.runtimes import openvino_available
    from service.operations.threads import name_this_thread
    name_this_thread("bs-test")
    available = openvino_available()
    if available:
        import openvino as ov
        ov.Core().get_available_devices()
    print(json.dumps({"available": available, "events": events,
                      "telemetry": repr(sys.modules.get("openvino_telemetry", "absent"))}))
    """
)


def test_openvino_and_thread_names_start_no_process() -> None:
    pytest.importorskip("openvino")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}  # telemetry's opt-outs
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["available"]
    assert result["events"] == []
    assert result["telemetry"] == "None"
