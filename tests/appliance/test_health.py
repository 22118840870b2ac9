"""The web side is up: health answers without login, everything else needs one."""
from django.test import Client

import channel_engine


def test_it_answers_health_without_login(client: Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "engine": channel_engine.__version__}


def test_it_sends_the_admin_to_login(client: Client) -> None:
    response = client.get("/admin/")
    assert response.status_code == 302 and "/login" in response["Location"]
