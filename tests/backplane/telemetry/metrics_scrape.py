"""/metrics read the way Prometheus reads it, for the metrics tests (tests/backplane/telemetry/test_metrics_*.py)."""

from __future__ import annotations

from dataclasses import dataclass

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    samples: dict[tuple[str, LabelSet], float]
    families: frozenset[str]

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a series not (yet) there, as a counter that never moved."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def moved_since(self, earlier: Scrape, name: str, **labels: str) -> float:
        """How far a series moved between an earlier scrape and this one."""
        return self.value(name, **labels) - earlier.value(name, **labels)

    def total(self, name: str, **labels: str) -> float:
        """The sum over the series of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(value for (sample, label_set), value in self.samples.items()
                   if sample == name and wanted <= set(label_set))

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(label_set)[label] for (sample, label_set) in self.samples
                if sample == name and label in dict(label_set)}

    @property
    def names(self) -> set[str]:
        """Every family name and every sample name (with ``_total``, ``_bucket``, ``_sum``, ``_count``)."""
        return set(self.families) | {name for name, _ in self.samples}


def scrape(client: Client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    samples: dict[tuple[str, LabelSet], float] = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(response.content.decode()):
        families.add(family.name)
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"{key} appears twice on /metrics"
            samples[key] = sample.value
    return Scrape(samples=samples, families=frozenset(families))
