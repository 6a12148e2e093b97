"""``doctor --json``'s schema (:class:`tunecache.client.doctor_report.DoctorReport`) is the one
docs/pods.md describes, field by field, so that a pipeline reading the docs reads the document."""

from __future__ import annotations

import re

from tests.support.paths import ROOT
from tunecache.client.doctor_report import SCHEMA_VERSION, DoctorReport, ImageVersions, KindVerdict


def test_every_field_of_the_document_is_in_the_pods_guides_table_and_nothing_else():
    text = (ROOT / "docs" / "pods.md").read_text()
    section = text[text.index("### doctor --json"):]
    section = section[:section.index("\n## ")]
    documented = {name for cell in re.findall(r"^\| ([^|]+) \|", section, re.M) for name in re.findall(r"`(\w+)`", cell)}
    assert documented == set(DoctorReport.model_fields), documented ^ set(DoctorReport.model_fields)
    assert f'"schema_version": {SCHEMA_VERSION}' in section
    image = re.search(r'"image": (\{[^}]*\})', section)[1]
    assert set(re.findall(r'"(\w+)":', image)) == set(ImageVersions.model_fields)
    assert set(KindVerdict.model_fields) == {"kind", "loads", "why"}
