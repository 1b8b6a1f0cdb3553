"""`fd chat --image PATH`: the picture rides in the next user message as a base64 data: URL image_url
part; a file that is missing or not a PNG/JPEG/WebP picture is one line on stderr and a non-zero exit,
before any request."""

from __future__ import annotations

import base64

from image_fixtures import encoded
from typer.testing import CliRunner

from fdcli.main import app

runner = CliRunner()


class RecordingClient:
    """Stands in for fdcli's ApiClient: records each streamed body and answers "ok"."""

    bodies: list[dict] = []

    def __init__(self, url, api_key, timeout=600.0):
        self.base = url  # ApiClient's resolved address, which fd chat prints

    def first_model(self) -> str:
        return "m"

    def stream(self, path, body):
        RecordingClient.bodies.append(body)
        yield {"choices": [{"index": 0, "delta": {"content": "ok"}}]}


def test_image_goes_with_the_first_user_message(tmp_path, monkeypatch):
    monkeypatch.setattr("fdcli.commands.chat.ApiClient", RecordingClient)
    RecordingClient.bodies = []
    png, jpg = tmp_path / "a.png", tmp_path / "b.jpg"
    png.write_bytes(encoded("PNG"))
    jpg.write_bytes(encoded("JPEG"))
    r = runner.invoke(
        app, ["chat", "--image", str(png), "--image", str(jpg)], input="what is it?\nand now?\n/exit\n"
    )
    assert r.exit_code == 0, r.output
    first, second = RecordingClient.bodies
    parts = first["messages"][0]["content"]
    assert parts == [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()},
        },
        {
            "type": "image_url",
            "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpg.read_bytes()).decode()},
        },
        {"type": "text", "text": "what is it?"},
    ]
    assert second["messages"][-1] == {"role": "user", "content": "and now?"}  # attached once only


def test_quick_with_an_image(tmp_path, monkeypatch):
    monkeypatch.setattr("fdcli.commands.chat.ApiClient", RecordingClient)
    RecordingClient.bodies = []
    webp = tmp_path / "c.webp"
    webp.write_bytes(encoded("WEBP"))
    r = runner.invoke(app, ["chat", "-q", "describe", "--image", str(webp)])
    assert r.exit_code == 0 and r.stdout == "ok\n", r.output
    (body,) = RecordingClient.bodies
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/webp;base64,")


def test_missing_or_unsupported_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("fdcli.commands.chat.ApiClient", RecordingClient)
    RecordingClient.bodies = []
    gif = tmp_path / "x.gif"
    gif.write_bytes(encoded("GIF"))
    cases = [
        (tmp_path / "missing.png", "cannot read --image"),
        (gif, "not a PNG, JPEG or WebP"),
        (tmp_path, "cannot read"),
    ]
    for path, words in cases:
        r = runner.invoke(app, ["chat", "-q", "hi", "--image", str(path)])
        assert r.exit_code != 0, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.stderr
    assert RecordingClient.bodies == []  # nothing was sent


def test_text_only_server_refuses_the_attached_picture(server, tmp_path):
    # The shared tiny Llama server decodes the picture (it is valid), then says its model takes no images.
    png = tmp_path / "a.png"
    png.write_bytes(encoded("PNG"))
    args = ["chat", "--url", f"{server.url}/v1", "--api-key", server.api_key, "-q", "hi", "--image", str(png)]
    r = runner.invoke(app, args)
    assert r.exit_code != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not accept images" in lines[0], r.stderr
