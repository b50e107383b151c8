"""JWT mode (``server.jwt_issuer_key``; SDK 0.38's ``pjwt_auth_enabled``): the real SDK exchanges
its API key at /auth/token and trains and samples with the JWT; tokens interoperate with PyJWT
(an independent implementation) both ways; forged, expired, re-exchanged and ``alg: none``
tokens are refused with the ``invalid_token`` challenge the SDK answers by re-exchanging."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import tinker
from tinker import types
from tinker.lib._jwt_auth import JwtAuthProvider

from loraplex.config import DEFAULT_MODEL_NAME
from loraplex.store.keys import OPEN_TENANT_PREFIX, hash_key
from tests.api.conftest import Server
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

ISSUER_KEY = "test-issuer-key-" + "x" * 32
DATUM = types.Datum(model_input=types.ModelInput.from_ints([2, 3, 4]),
                    loss_fn_inputs={"target_tokens": [3, 4, 5], "weights": [1.0] * 3})


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ctx = fake_context(str(tmp_path_factory.mktemp("jwt-data")), executor="toy",
                       jwt_issuer_key=ISSUER_KEY, jwt_lifetime_s=600)
    with live_server(ctx) as url:
        yield url
    ctx.stores.close()


def call(url: str, credential: str, path: str = "/api/v1/loraplex/usage") -> httpx.Response:
    return httpx.get(f"{url}{path}", headers={"X-API-Key": credential}, trust_env=False,
                     timeout=30)


def exchange(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/auth/token", json={}, headers={"X-API-Key": key},
                      trust_env=False, timeout=30)


def pyjwt(claims: dict[str, Any], key: str = ISSUER_KEY, algorithm: str = "HS256") -> str:
    now = int(time.time())
    return jwt.encode({"iss": "loraplex", "iat": now, "exp": now + 300, **claims}, key,
                      algorithm=algorithm)


def test_the_sdk_trains_and_samples_with_jwts(jwt_server: str) -> None:
    key = f"tml-jwt-{uuid.uuid4().hex[:8]}"
    client = tinker.ServiceClient(base_url=jwt_server, api_key=key)
    tc = client.create_lora_training_client(base_model=DEFAULT_MODEL_NAME, rank=4).result()
    tc.forward_backward([DATUM], "cross_entropy").result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    assert sampler.sample(DATUM.model_input, 1, types.SamplingParams(max_tokens=2)).result()
    auth = client.holder._default_auth
    assert isinstance(auth, JwtAuthProvider) and auth._token.startswith("eyJ")
    claims = jwt.decode(auth._token, ISSUER_KEY, algorithms=["HS256"], issuer="loraplex")
    assert claims["sub"] == OPEN_TENANT_PREFIX + hash_key(key)[:16]
    assert claims["exp"] - claims["iat"] == 600
    runs = httpx.get(f"{jwt_server}/api/v1/training_runs", headers={"X-API-Key": key},
                     trust_env=False, timeout=30).json()
    assert tc.model_id in str(runs), "the JWT's tenant is the key's"
    client.close("success").result(timeout=90)


def test_the_sdk_replays_once_after_an_invalid_token(jwt_server: str) -> None:
    client = tinker.ServiceClient(base_url=jwt_server, api_key="tml-jwt-replay")
    auth = client.holder._default_auth
    assert isinstance(auth, JwtAuthProvider)
    auth._token = pyjwt({"sub": "intruder"}, key="y" * 40)  # unexpired, wrongly signed
    tc = client.create_lora_training_client(base_model=DEFAULT_MODEL_NAME, rank=4).result()
    assert tc.forward_backward([DATUM], "cross_entropy").result().metrics
    assert jwt.decode(auth._token, ISSUER_KEY, algorithms=["HS256"])["sub"] != "intruder"
    client.close("success").result(timeout=90)


def test_tokens_interoperate_with_pyjwt_and_bad_ones_are_refused(jwt_server: str) -> None:
    token = exchange(jwt_server, "tml-jwt-raw").json()["jwt"]
    assert call(jwt_server, token).status_code == 200
    tenant = jwt.decode(token, ISSUER_KEY, algorithms=["HS256"])["sub"]
    assert call(jwt_server, pyjwt({"sub": tenant})).status_code == 200, "PyJWT-minted"
    refused = {
        "forged": pyjwt({"sub": tenant}, key="z" * 40),
        "expired": jwt.encode({"iss": "loraplex", "sub": tenant, "iat": 1, "exp": 2},
                              ISSUER_KEY, algorithm="HS256"),
        "alg none": jwt.encode({"iss": "loraplex", "sub": tenant, "exp": 2**40}, None,
                               algorithm="none"),
        "other issuer": pyjwt({"sub": tenant, "iss": "someone"}),
        "tampered": token.rsplit(".", 2)[0] + "." + pyjwt({"sub": "root"}).split(".")[1]
        + "." + token.rsplit(".", 1)[1],
        # once a 500: the header was parsed before the signature was checked
        "nested header": base64.urlsafe_b64encode(b'{"a":' + b"[" * 5_000).decode().rstrip("=")
        + ".e30." + token.rsplit(".", 1)[1],
    }
    for label, bad in refused.items():
        response = call(jwt_server, bad)
        assert response.status_code == 401, label
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"', label
    assert exchange(jwt_server, token).status_code == 401, "a JWT is not exchanged for another"


def test_jwt_mode_is_off_by_default(server: Server, new_key: Callable[[], str],
                                    tmp_path: Path) -> None:
    config = httpx.post(f"{server.url}/api/v1/client/config", json={}, trust_env=False).json()
    assert config["pjwt_auth_enabled"] is False
    assert exchange(server.url, new_key()).status_code == 404
    assert call(server.url, pyjwt({"sub": "x"})).status_code == 401, "JWTs are not keys"


def test_revoking_a_key_stops_its_jwts_within_the_key_cache_ttl(
        tmp_path: Path) -> None:
    """A revoked key's JWTs stayed valid until they expired (15 min by default); now the
    tenant's revocation time is reloaded once per ``key_cache_ttl_s`` and older JWTs fail."""
    ttl = 0.5
    ctx = fake_context(str(tmp_path / "data"), executor="toy", open_access=False,
                       jwt_issuer_key=ISSUER_KEY, jwt_lifetime_s=600, key_cache_ttl_s=ttl)
    try:
        with live_server(ctx) as url:
            key = ctx.stores.keys.create("revokee")
            other = ctx.stores.keys.create("bystander")
            token, kept = exchange(url, key).json()["jwt"], exchange(url, other).json()["jwt"]
            assert call(url, token).status_code == 200
            ctx.stores.keys.revoke("revokee")
            time.sleep(ttl + 0.3)
            refused = call(url, token)
            assert refused.status_code == 401 and "revoked" in refused.text
            assert exchange(url, key).status_code == 401
            assert call(url, kept).status_code == 200, "another tenant's JWT is unaffected"
    finally:
        ctx.stores.close()
