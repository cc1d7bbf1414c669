"""The studio put together: the root URLconf that mounts every app's pages and API, the
site's health check, and the `studio` command that starts every process. It sits above
every app, and nothing imports it."""
