"""``GET /api/v1/loraplex/dashboard/operator`` as sent: queue waits per tenant and class, the
latest refused submits with per-tenant totals, and every tenant's priced usage."""

from __future__ import annotations

from pydantic import BaseModel

from loraplex.api.responses.stats import WaitPercentiles
from loraplex.api.responses.usage import PriceSheetView, UsageSummaryView


class AdmissionEventView(BaseModel):
    """One refused submit: ``time`` in Unix seconds, ``kind`` the op's request type,
    ``reason`` what the client was told."""

    time: float
    tenant: str
    kind: str
    reason: str
    lane: str


class Admissions(BaseModel):
    events: list[AdmissionEventView]
    rejected: dict[str, dict[str, int]]


class TenantUsageView(BaseModel):
    tenant: str
    totals: UsageSummaryView


class OperatorUsage(BaseModel):
    price_sheet: PriceSheetView
    tenants: list[TenantUsageView]


class OperatorView(BaseModel):
    queue_waits_s: dict[str, dict[str, WaitPercentiles]]
    admissions: Admissions
    usage: OperatorUsage
