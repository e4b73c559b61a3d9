"""The static calculator in Chromium: page weight and time to the first verdict. Prints a Markdown table.

    python benchmarks/bench_page.py          # after a book build (_build/html)

Serves the built site from 127.0.0.1 and opens the calculator's page in a fresh browser context (nothing
cached) with Debian's Chromium, as tests/book/test_browser.py does. Reports, as medians of a few runs:

1. the bytes the page loads until its first verdict (the step's peak of the starting state, from a record the
   site carries) and the time from navigation to that verdict;
2. a structure the site does not carry: the bytes Pyodide, SymPy and memledger's source add, and the time from
   the change to its verdict (memledger builds the step in the browser);
3. a second such structure, Pyodide already loaded.
"""
import functools
import http.server
from pathlib import Path
import statistics
import threading
import time

from playwright.sync_api import sync_playwright

SITE = Path(__file__).resolve().parents[1] / "_build" / "html"
PAGE = "book/09_together.html"
CHROMIUM = "/usr/bin/chromium"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _judged(page, needle, timeout=300_000):
    page.wait_for_function("""needle => {
        const v = document.querySelector("[data-judged-bytes]"), c = document.querySelector("[data-cli]");
        return v && c && c.dataset.cli.includes(needle);
    }""", arg=needle, timeout=timeout)


def one_run(browser, base):
    context = browser.new_context()
    page = context.new_page()
    loaded = []
    page.on("requestfinished", lambda r: loaded.append(r.sizes()["responseBodySize"]))
    start = time.perf_counter()
    page.goto(base + PAGE)
    _judged(page, "--preset article-7b")
    first, first_bytes = time.perf_counter() - start, sum(loaded)
    marks = []
    for changes, needle in (({"arch": "llama3-8b", "zero_stage": "3", "recipe": "fp32-adamw"}, "--zero 3"),
                            ({"recompute": "selective"}, "--recompute selective")):
        before, start = sum(loaded), time.perf_counter()
        for name, value in changes.items():
            page.select_option(f'[name="{name}"]', value)
        _judged(page, needle)
        marks.append((time.perf_counter() - start, sum(loaded) - before))
    context.close()
    return (first, first_bytes), *marks


def main(runs=3):
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                             "--disable-gpu"])
        results = [one_run(browser, base) for _ in range(runs)]
        browser.close()
    server.shutdown()

    def median(i, j):
        return statistics.median(r[i][j] for r in results)
    print("| the calculator's page in Chromium (fresh context) | median |")
    print("|---|---:|")
    print(f"| page weight until the first verdict (all files, the starting state's step record) | "
          f"{median(0, 1) / 2**20:.1f} MiB |")
    print(f"| time from navigation to the first verdict (the step's peak) | {median(0, 0) * 1e3:.0f} ms |")
    print(f"| a structure the site does not carry: bytes added (Pyodide, SymPy, memledger's source) | "
          f"{median(1, 1) / 2**20:.1f} MiB |")
    print(f"| its verdict, from the change (Pyodide starts, memledger builds the step) | {median(1, 0):.1f} s |")
    print(f"| the next such structure (Pyodide loaded) | {median(2, 0) * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
