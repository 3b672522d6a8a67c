"""Submitting on behalf of a user: who the job's owner is, and whether the caller may say so.

A person submits as themself: the owner is the caller (the request subject's user token). A service account
(``svc-<name>``, ``libs/core/scopes.py``) submits only on behalf of a user, naming them in
``SubmitRequest.on_behalf_of`` (sbatch's ``CORRAL_ON_BEHALF_OF``): the job is that user's, charged to the
request's account or that user's default one, and accepted only when the service account's scope lists
the account or the user, and the user may charge the account. Everything after this (validation, limits,
the job's identity when it runs) is about the owner; the JobSubmitted entry records the service account.
"""

from __future__ import annotations

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core import scopes
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.schemas import api, subjects


def owner_of(caller: str, req: api.SubmitRequest, config: ClusterConfig) -> tuple[str, str]:
    """(owner, service account name or "") of a submission by ``caller``; Forbidden or InvalidInput
    naming the scope when the caller may not submit it."""
    sa = scopes.account_of_login(caller, config.service_accounts)
    if req.on_behalf_of is None:
        if sa is not None:
            raise Forbidden(
                f"on_behalf_of: service account {sa.name!r} submits only on behalf of a user; "
                "name one (sbatch: CORRAL_ON_BEHALF_OF=USER)"
            )
        return caller, ""
    if sa is None:
        raise Forbidden(
            f"on_behalf_of: {caller} is not a service account; only a service account may submit on behalf "
            "of another user (corral serviceaccount add)"
        )
    owner = req.on_behalf_of
    if not subjects.valid_token(owner) or owner.startswith((scopes.PREFIX, scopes.AGENT_PREFIX, "corral-")):
        raise InvalidInput(f"on_behalf_of: {owner!r} is not a user name", field="on_behalf_of")
    account = req.spec.account or config.default_account(owner)
    problem = scopes.submit_problem(sa, owner, account, config.may_use(owner, account))
    if problem is not None:
        raise Forbidden(f"on_behalf_of: {problem}")
    return owner, sa.name
