import pytest

from studio import actions


@pytest.mark.parametrize("url", ["/admin/studio/project/", "/admin/studio/apitoken/", "/admin/datasets/dataset/",
                                 "/admin/datasets/datasetversion/", "/admin/jobs/node/", "/admin/jobs/trainingjob/"])
def test_admin_changelists_open_for_a_superuser(client, db, url):
    admin = actions.ensure_user("root", password="pw-root-123", superuser=True)
    actions.issue_token(admin, name="listed")
    client.force_login(admin)
    assert client.get(url).status_code == 200


def test_admin_refuses_non_staff(client, owner):
    client.force_login(owner)
    response = client.get("/admin/studio/project/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
