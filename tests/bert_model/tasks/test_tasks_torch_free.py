"""bert_model.tasks is imported by the service, whose image has no torch: no module may import it."""

import pkgutil
import subprocess
import sys

import bert_model.tasks


def test_no_task_module_imports_torch() -> None:
    modules = [f"bert_model.tasks.{m.name}" for m in pkgutil.iter_modules(bert_model.tasks.__path__)]
    assert {"bert_model.tasks.qa", "bert_model.tasks.ner", "bert_model.tasks.metrics"} <= set(modules)
    code = "import sys; sys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in modules)
    code += "assert sys.modules['torch'] is None\nprint('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
