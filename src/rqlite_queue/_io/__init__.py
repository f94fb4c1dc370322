"""The I/O under the queue: rqlite over HTTP (`urllib3_client` for threads, `aiohttp_client` for
asyncio, both driving `_protocol.http.exchange`) and the embedded SQLite file (`sqlite`)."""
