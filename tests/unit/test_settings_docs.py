"""The settings tables of the docs are made from the settings' declarations
(``scripts/settings_docs.py``): they are up to date, every ``TUNECACHE_*`` variable the code
names is declared (a settings field or a declared table, with a description), and a table
edited by hand is found out."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("settings_docs", ROOT / "scripts" / "settings_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("settings_docs", module)
    spec.loader.exec_module(module)
    return module


settings_docs = _script()

#: Where the code that reads ``TUNECACHE_*`` variables lives: both distributions, the tests, the
#: scripts, the benchmarks and what deploys them.
CODE = ("client", "service", "tests", "scripts", "bench", "deploy", ".ci", "Dockerfile", "docker-compose.yml")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ""}
#: A variable's name as the code writes it (not a part of a longer name such as a test's).
VARIABLE = re.compile(r"\bTUNECACHE_[A-Z0-9_]*[A-Z0-9]\b")


def _code_files(root: Path) -> list[Path]:
    files = []
    for name in CODE:
        path = root / name
        candidates = [path] if path.is_file() else path.rglob("*")
        files += [file for file in candidates if file.is_file() and file.suffix in SUFFIXES
                  and "fixtures" not in file.parts and "__pycache__" not in file.parts]
    return files


def _copy_documents(root: Path) -> None:
    for document in settings_docs.DOCUMENTS:
        (root / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / document, root / document)


def test_the_docs_settings_tables_are_up_to_date():
    assert settings_docs.stale() == [], "run: python scripts/settings_docs.py"


def test_every_tunecache_variable_the_code_names_is_declared():
    declared = settings_docs.declared_variables()
    undeclared = {}
    for file in _code_files(ROOT):
        for name in VARIABLE.findall(file.read_text(encoding="utf-8", errors="replace")):
            if name not in declared:
                undeclared.setdefault(name, str(file.relative_to(ROOT)))
    assert len(_code_files(ROOT)) > 100  # the scan saw the code
    assert not undeclared, "declare these (a settings field, or a table such as POD_VARIABLES): " + ", ".join(
        f"{name} ({where})" for name, where in sorted(undeclared.items()))


def test_every_declared_variable_has_a_description_and_a_shown_default():
    for table in settings_docs.TABLES.values():
        for name, field in table.variables.items():
            assert field.description and len(field.description) > 10, name
            assert settings_docs._shown_default(name, field), name


def test_a_retired_variable_is_named_by_the_setting_that_replaced_it():
    from tunecache.service.settings import RETIRED_VARIABLES, Settings

    for name, field in RETIRED_VARIABLES.items():
        assert f"Replaces `{name}`" in Settings.model_fields[field].description


def test_declared_defaults_are_the_codes():
    from tunecache.store.http import DEFAULT_MAX_ANSWER_BYTES, max_answer_bytes
    from tunecache.client.settings import POD_VARIABLES
    from tunecache.formats.tarball import max_unpack_bytes, max_unpack_files

    assert POD_VARIABLES["TUNECACHE_MAX_ANSWER_BYTES"].default == DEFAULT_MAX_ANSWER_BYTES == max_answer_bytes()
    assert POD_VARIABLES["TUNECACHE_MAX_UNPACK_BYTES"].default == max_unpack_bytes()
    assert POD_VARIABLES["TUNECACHE_MAX_UNPACK_FILES"].default == max_unpack_files()


def test_a_row_edited_by_hand_is_found_and_rewritten(tmp_path):
    _copy_documents(tmp_path)
    guide = tmp_path / "docs" / "operator-guide.md"
    text = guide.read_text()
    edited = text.replace("| `TUNECACHE_THREADS` | `40` |", "| `TUNECACHE_THREADS` | `64` |")
    assert edited != text
    guide.write_text(edited)
    assert settings_docs.stale(tmp_path) == ["docs/operator-guide.md: settings tables out of date "
                                             "(run scripts/settings_docs.py)"]
    assert settings_docs.updated(edited) == text


def test_a_table_no_document_holds_or_an_unknown_one_is_refused(tmp_path):
    _copy_documents(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("settings-table development ", "settings-table developmint "))
    with pytest.raises(ValueError, match="no settings table called 'developmint'"):
        settings_docs.stale(tmp_path)
