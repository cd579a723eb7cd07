"""Namespaces (DESIGN section 2): a class's namespace is ``module.QualName``, where a
script run as ``__main__`` counts as the module its file would be imported as, so data
never vanishes because a script was started another way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP = textwrap.dedent('''
    import sys

    import trio

    import nursery_jobs as nj


    class Notes(nj.DurableObject):
        async def put(self, value: str) -> None:
            self.ctx.storage.put("v", value)

        async def get(self) -> str | None:
            return self.ctx.storage.get("v")


    async def main(data: str, op: str) -> None:
        async with nj.open_runtime(data) as rt:
            notes = rt.get(Notes, "n")
            if op == "put":
                await notes.put("hello")
            else:
                print(await notes.get())
        print(Notes.namespace)


    if __name__ == "__main__":
        trio.run(main, sys.argv[1], sys.argv[2])
''')


def _python(cwd: Path, *args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(cwd), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.crash
def test_a_script_and_an_import_of_it_name_the_same_objects(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    data = str(tmp_path / "data")
    # python app.py: the class is __main__.Notes, its namespace app.Notes.
    assert _python(tmp_path, "app.py", data, "put") == ["app.Notes"]
    # from app import ...: the same objects.
    assert _python(tmp_path, "-c", f"import trio, app; trio.run(app.main, {data!r}, 'get')") == [
        "hello", "app.Notes"]
    # python -m app, and the script run by its path from elsewhere: the same again.
    assert _python(tmp_path, "-m", "app", data, "get") == ["hello", "app.Notes"]
    assert _python(tmp_path.parent, str(tmp_path / "app.py"), data, "get") == [
        "hello", "app.Notes"]


@pytest.mark.crash
def test_a_packages_main_names_the_same_objects_run_with_dash_m_by_path_or_imported(
    tmp_path: Path,
) -> None:
    """``python -m app`` runs ``app/__main__.py``: the module that file is imported as
    is ``app.__main__``, so its objects are those of ``python app/__main__.py`` and of
    ``import app.__main__``, and their recorded class path imports (a host that has not
    imported the class resolves it from there)."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "__main__.py").write_text(
        APP.replace("    print(Notes.namespace)\n",
                    "    print(Notes.namespace)\n"
                    "    from nursery_jobs._core._object import class_path\n"
                    "    print(class_path(Notes))\n"))
    data = str(tmp_path / "data")
    namespace, path = _python(tmp_path, "-m", "app", data, "put")
    assert namespace == "app.__main__.Notes"
    assert _python(tmp_path, "app/__main__.py", data, "get") == ["hello", namespace, path]
    assert _python(tmp_path, "-c", f"import trio, app.__main__ as m;"
                   f" trio.run(m.main, {data!r}, 'get')") == ["hello", namespace, path]
    resolved = _python(tmp_path, "-c", "from nursery_jobs._core._object import"
                       f" resolve_namespace as r; c = r({namespace!r}, {path!r});"
                       " print(c.namespace)")
    assert resolved == [namespace]


@pytest.mark.parametrize("bad", ["", "a\x00b", "x\ud800"])
def test_a_namespace_no_engine_can_store_is_refused_naming_it(bad: str) -> None:
    import nursery_jobs as nj

    with pytest.raises(nj.ObjectIdError, match=r"Bad\.namespace") as info:
        type("Bad", (nj.DurableObject,), {"namespace": bad})
    assert (info.value.namespace, info.value.object_id) == (bad, None)
