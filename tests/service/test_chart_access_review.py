"""The chart's rule for `check-config --cluster`'s SelfSubjectAccessReviews, rendered by the real
Helm engine: off by default (Kubernetes grants it to every authenticated user), on when asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helm_python import Chart, HelmError

from tests.service.test_chart import CHART, find, render


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def test_the_access_review_rule_is_rendered_when_asked(chart: Any) -> None:
    values = {"config": {"resources": [{"resource": "pods", "namespace": "web"}],
                         "sinks": [{"name": "s", "kind": "stdout"}], "checkpoint": {"store": "file"}}}
    assert find(render(chart, values), "ClusterRole") == []
    docs = render(chart, {**values, "rbac": {"accessReview": True}})
    (role,) = find(docs, "ClusterRole")
    assert role["metadata"]["name"] == "keb-kube-event-bridge-access-review"
    assert role["rules"] == [{"apiGroups": ["authorization.k8s.io"],
                              "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]}]
    (binding,) = find(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "keb-kube-event-bridge",
                                    "namespace": "ops"}]
    # rbac.create off: no rule at all.
    off = render(chart, {**values, "rbac": {"create": False, "accessReview": True}})
    assert find(off, "ClusterRole") == []


def test_the_schema_rejects_a_misspelt_value(chart: Any) -> None:
    with pytest.raises(HelmError, match=r"accessReview|additional"):
        render(chart, {"rbac": {"accessReviews": True}})
