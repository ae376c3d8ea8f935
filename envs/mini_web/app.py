"""The shop-and-tickets web application: a real HTTP server on loopback over one SQLite database.

:class:`Site` owns the database connection (the ground truth) and a ``ThreadingHTTPServer`` bound to
``127.0.0.1`` on an ephemeral port. Pages are plain server-rendered HTML (no scripts, no off-host resources);
forms post to endpoints that change the database and answer ``303 See Other``. Payment, refund, send and delete
are simulated: they write a ``ledger`` row and touch nothing outside the database.
"""

from __future__ import annotations

import html
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from .data import AGENTS, CATEGORIES, COUPONS, PRIORITIES, SHIPPING, TICKET_CATEGORIES, TICKET_STATUSES

HOST = "127.0.0.1"
SITE_NAME = "Mini Shop"
MAX_BODY = 64 * 1024


class Reply:
    """A page (status + HTML) or a redirect."""

    def __init__(self, status: int, body: str = "", location: str | None = None):
        self.status, self.body, self.location = status, body, location


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def page(title: str, *parts: str, msg: str = "", error: str = "") -> str:
    nav = "".join(f'<li><a href="{href}">{esc(label)}</a></li>' for href, label in (
        ("/", "Home"), ("/products", "Products"), ("/cart", "Cart"), ("/orders", "Orders"), ("/tickets", "Tickets"),
        ("/inbox", "Inbox"), ("/giftcards", "Gift cards"), ("/account", "Account"), ("/contact", "Contact")))
    status = f'<p role="status">{esc(msg)}</p>' if msg else ""
    alert = f'<p role="alert">{esc(error)}</p>' if error else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} - {SITE_NAME}</title></head>"
            f"<body><nav aria-label='Main'><ul>{nav}</ul></nav><main><h1>{esc(title)}</h1>{status}{alert}"
            + "".join(parts) + "</main></body></html>")


def text_input(name: str, label: str, value: Any = "", kind: str = "text") -> str:
    return f'<input type="{kind}" name="{name}" aria-label="{esc(label)}" value="{esc(value)}">'


def textarea(name: str, label: str, value: str = "") -> str:
    return f'<textarea name="{name}" aria-label="{esc(label)}">{esc(value)}</textarea>'


def select(name: str, label: str, options: Iterable[tuple[str, str]], selected: str = "") -> str:
    opts = "".join(f'<option value="{esc(v)}"{" selected" if v == selected else ""}>{esc(t)}</option>'
                   for v, t in options)
    return f'<select name="{name}" aria-label="{esc(label)}">{opts}</select>'


def form(action: str, label: str, *fields: str, button: str, method: str = "post") -> str:
    return (f'<form method="{method}" action="{esc(action)}" aria-label="{esc(label)}">' + "".join(fields)
            + f'<button type="submit">{esc(button)}</button></form>')


def hidden(name: str, value: Any) -> str:
    return f'<input type="hidden" name="{name}" value="{esc(value)}">'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _one(q: dict[str, list[str]], key: str, default: str = "") -> str:
    v = q.get(key)
    return v[0] if v else default


class Site:
    """The application over one SQLite connection; ``serve()`` starts the loopback HTTP server."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self.lock = threading.RLock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.requests = 0

    # -- database ----------------------------------------------------------------------------------------------
    def load(self, image: bytes) -> None:
        """Replace the whole database by a serialized image (reset and restore)."""
        with self.lock:
            self.conn.deserialize(image)

    def image(self) -> bytes:
        with self.lock:
            return self.conn.serialize()

    def q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.lock:
            return list(self.conn.execute(sql, params))

    def x(self, sql: str, *params: Any) -> int:
        with self.lock:
            cur = self.conn.execute(sql, params)
            return int(cur.lastrowid or 0)

    def ledger(self, kind: str, target: str, amount_cents: int, detail: str) -> None:
        self.x("INSERT INTO ledger (kind, target, amount_cents, detail) VALUES (?, ?, ?, ?)", kind, target,
               amount_cents, detail)

    # -- server ------------------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.server is None:
            raise RuntimeError("the site is not serving")
        return f"http://{HOST}:{self.server.server_address[1]}"

    def serve(self) -> None:
        if self.server is not None:
            return
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the env records every request
                pass

            def do_GET(self) -> None:
                self._answer(site.handle("GET", self.path, b""))

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n > MAX_BODY:
                    self._answer(Reply(413, page("Request too large", error="The form is too large.")))
                    return
                self._answer(site.handle("POST", self.path, self.rfile.read(n)))

            def _answer(self, reply: Reply) -> None:
                data = reply.body.encode("utf-8")
                self.send_response(reply.status)
                if reply.location is not None:
                    self.send_header("Location", reply.location)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        # A short poll interval keeps close() (shutdown waits for one poll) cheap.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="mini-web-site", daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None
        self.conn.close()

    # -- routing -----------------------------------------------------------------------------------------------
    def handle(self, method: str, target: str, body: bytes) -> Reply:
        with self.lock:
            self.requests += 1
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        query = parse_qs(parts.query, keep_blank_values=True)
        form_data = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True) if body else {}
        segs = [s for s in path.split("/") if s]
        route = self._route(method, segs)
        if route is None:
            return Reply(404, page("Not found", error=f"No page at {path}."))
        handler, ids = route
        try:
            with self.lock:
                return handler(query if method == "GET" else form_data, *ids)
        except _BadForm as e:
            return Reply(400, page("Form error", f'<p><a href="{esc(e.back)}">Back</a></p>', error=str(e)))
        except Exception as e:  # a bug of the site: answer 500 (the env reports ENV_BUG) instead of dropping the line
            return Reply(500, page("Server error", error=f"{type(e).__name__}: {e}"))

    def _route(self, method: str, segs: list[str]) -> tuple[Callable[..., Reply], list[int]] | None:
        ids: list[int] = []
        shape: list[str] = []
        for s in segs:
            if s.isdigit() and len(s) < 9:
                ids.append(int(s))
                shape.append("#")
            else:
                shape.append(s)
        key = (method, "/".join(shape))
        fn = ROUTES.get(key)
        return (getattr(self, fn), ids) if fn else None

    # -- pages -------------------------------------------------------------------------------------------------
    def home(self, q: dict[str, list[str]]) -> Reply:
        n_cart = self.q("SELECT coalesce(sum(qty), 0) FROM cart_items")[0][0]
        n_open = self.q("SELECT count(*) FROM tickets WHERE status = 'open'")[0][0]
        return Reply(200, page("Welcome", f"<p>Items in cart: {n_cart}. Open tickets: {n_open}.</p>",
                               msg=_one(q, "msg")))

    def products(self, q: dict[str, list[str]]) -> Reply:
        term, cat, sort = _one(q, "q").strip(), _one(q, "category", "all"), _one(q, "sort", "name")
        order = {"price_asc": "price_cents, id", "price_desc": "price_cents DESC, id", "rating": "rating DESC, id",
                 "name": "name, id"}.get(sort, "name, id")
        rows = self.q(f"SELECT id, name, category, price_cents, rating, stock FROM products WHERE "
                      f"(? = 'all' OR category = ?) AND (? = '' OR lower(name) LIKE '%' || lower(?) || '%') "
                      f"ORDER BY {order}", cat, cat, term, term)
        search = form("/products", "Search products", text_input("q", "Search", term),
                      select("category", "Category", [("all", "all"), *((c, c) for c in CATEGORIES)], cat),
                      select("sort", "Sort by", [("name", "name"), ("price_asc", "price, low to high"),
                                                 ("price_desc", "price, high to low"), ("rating", "rating")], sort),
                      button="Search", method="get")
        listing = table(("Product", "Category", "Price", "Rating", "Stock"), (
            (f'<a href="/products/{r[0]}">{esc(r[1])}</a>', esc(r[2]), money(r[3]), f"{r[4]:.1f}", str(r[5]))
            for r in rows))
        return Reply(200, page("Products", search, f"<p>{len(rows)} products</p>", listing))

    def product(self, q: dict[str, list[str]], pid: int) -> Reply:
        rows = self.q("SELECT id, name, category, price_cents, rating, stock, description FROM products WHERE id = ?",
                      pid)
        if not rows:
            return Reply(404, page("Not found", error=f"No product {pid}."))
        _, name, cat, price, rating, stock, desc = rows[0]
        reviews = self.q("SELECT author, stars, body FROM reviews WHERE product_id = ? ORDER BY id", pid)
        add = form("/cart/add", "Add to cart", hidden("product_id", pid), text_input("qty", "Quantity", 1, "number"),
                   button="Add to cart")
        revs = "".join(f"<li><article aria-label='Review by {esc(a)}'><p>{esc(a)}: {s}/5</p><p>{esc(b)}</p>"
                       f"</article></li>" for a, s, b in reviews)
        return Reply(200, page(name, f"<p>{esc(desc)}</p>",
                               f"<p>Price: {money(price)}. Category: {esc(cat)}. Rating: {rating:.1f}. "
                               f"In stock: {stock}.</p>", add, "<h2>Reviews</h2>", f"<ul>{revs}</ul>",
                               msg=_one(q, "msg")))

    def cart(self, q: dict[str, list[str]]) -> Reply:
        items = self.q("SELECT p.id, p.name, c.qty, p.price_cents FROM cart_items c JOIN products p "
                       "ON p.id = c.product_id ORDER BY p.id")
        rows = [(esc(n), str(qty), money(price * qty),
                 form(f"/cart/remove/{pid}", f"Remove {n}", button=f"Remove {n}")) for pid, n, qty, price in items]
        parts = [table(("Product", "Quantity", "Subtotal", ""), rows) if items else "<p>Your cart is empty.</p>"]
        if items:
            subtotal = sum(p * n for _, _, n, p in items)
            labels = [r[0] for r in self.q("SELECT label FROM addresses ORDER BY id")]
            parts.append(f"<p>Items: {money(subtotal)}</p>")
            parts.append(form("/checkout", "Checkout",
                              select("address", "Ship to", [(a, a) for a in labels], labels[0] if labels else ""),
                              select("shipping", "Shipping", [(k, f"{k} ({money(v)})") for k, v in SHIPPING.items()],
                                     "standard"),
                              text_input("coupon", "Coupon code"), button="Place order and pay"))
        return Reply(200, page("Cart", *parts, msg=_one(q, "msg")))

    def cart_add(self, f: dict[str, list[str]]) -> Reply:
        pid, qty = _int(f, "product_id", "/products"), _int(f, "qty", "/products")
        row = self.q("SELECT stock, name FROM products WHERE id = ?", pid)
        if not row:
            raise _BadForm(f"no product {pid}", "/products")
        have = self.q("SELECT qty FROM cart_items WHERE product_id = ?", pid)
        total = qty + (have[0][0] if have else 0)
        if qty < 1 or total > row[0][0]:
            raise _BadForm(f"quantity must be between 1 and the stock left ({row[0][0] - total + qty})",
                           f"/products/{pid}")
        self.x("INSERT INTO cart_items VALUES (?, ?) ON CONFLICT(product_id) DO UPDATE SET qty = ?", pid, total, total)
        return _see(f"/products/{pid}", f"Added {qty} x {row[0][1]} to the cart.")

    def cart_remove(self, f: dict[str, list[str]], pid: int) -> Reply:
        self.x("DELETE FROM cart_items WHERE product_id = ?", pid)
        return _see("/cart", "Removed from the cart.")

    def checkout(self, f: dict[str, list[str]]) -> Reply:
        items = self.q("SELECT p.id, c.qty, p.price_cents, p.stock, p.name FROM cart_items c JOIN products p "
                       "ON p.id = c.product_id ORDER BY p.id")
        if not items:
            raise _BadForm("the cart is empty", "/cart")
        address, shipping, coupon = _one(f, "address"), _one(f, "shipping"), _one(f, "coupon").strip().upper()
        if not self.q("SELECT 1 FROM addresses WHERE label = ?", address):
            raise _BadForm(f"unknown address {address!r}", "/cart")
        if shipping not in SHIPPING:
            raise _BadForm(f"unknown shipping {shipping!r}", "/cart")
        if coupon and coupon not in COUPONS:
            raise _BadForm(f"coupon {coupon!r} is not valid", "/cart")
        for _, qty, _, stock, name in items:
            if qty > stock:
                raise _BadForm(f"only {stock} of {name} left", "/cart")
        subtotal = sum(qty * price for _, qty, price, _, _ in items)
        total = subtotal - subtotal * COUPONS.get(coupon, 0) // 100 + SHIPPING[shipping]
        oid = self.x("INSERT INTO orders (status, total_cents, address_label, shipping, coupon) VALUES "
                     "('paid', ?, ?, ?, ?)", total, address, shipping, coupon)
        for pid, qty, price, _, _ in items:
            self.x("INSERT INTO order_items VALUES (?, ?, ?, ?)", oid, pid, qty, price)
            self.x("UPDATE products SET stock = stock - ? WHERE id = ?", qty, pid)
        self.x("DELETE FROM cart_items")
        self.ledger("payment", f"order:{oid}", total, f"card payment for order {oid}")
        return _see(f"/orders/{oid}", f"Order {oid} placed and paid ({money(total)}).")

    def orders(self, q: dict[str, list[str]]) -> Reply:
        rows = self.q("SELECT id, status, total_cents, shipping FROM orders ORDER BY id")
        return Reply(200, page("Orders", table(("Order", "Status", "Total", "Shipping"), (
            (f'<a href="/orders/{i}">Order {i}</a>', esc(s), money(t), esc(sh)) for i, s, t, sh in rows)),
            msg=_one(q, "msg")))

    def order(self, q: dict[str, list[str]], oid: int) -> Reply:
        rows = self.q("SELECT status, total_cents, address_label, shipping, coupon FROM orders WHERE id = ?", oid)
        if not rows:
            return Reply(404, page("Not found", error=f"No order {oid}."))
        status, total, address, shipping, coupon = rows[0]
        items = self.q("SELECT p.name, i.qty, i.price_cents FROM order_items i JOIN products p ON p.id = i.product_id "
                       "WHERE i.order_id = ? ORDER BY p.id", oid)
        parts = [f"<p>Status: {esc(status)}. Total: {money(total)}. Ship to: {esc(address)} ({esc(shipping)})."
                 + (f" Coupon: {esc(coupon)}." if coupon else "") + "</p>",
                 table(("Product", "Quantity", "Price"), ((esc(n), str(k), money(p)) for n, k, p in items))]
        if status in ("paid", "delivered"):
            parts.append(form(f"/orders/{oid}/refund", "Refund",
                              select("reason", "Refund reason", [(r, r) for r in ("damaged", "not as described",
                                                                                  "changed my mind")], "damaged"),
                              button="Request refund"))
        return Reply(200, page(f"Order {oid}", *parts, msg=_one(q, "msg")))

    def refund(self, f: dict[str, list[str]], oid: int) -> Reply:
        rows = self.q("SELECT status, total_cents FROM orders WHERE id = ?", oid)
        if not rows:
            raise _BadForm(f"no order {oid}", "/orders")
        if rows[0][0] not in ("paid", "delivered"):
            raise _BadForm(f"order {oid} cannot be refunded (status {rows[0][0]})", f"/orders/{oid}")
        reason = _one(f, "reason", "damaged")
        self.x("UPDATE orders SET status = 'refunded' WHERE id = ?", oid)
        self.ledger("refund", f"order:{oid}", rows[0][1], f"refund: {reason}")
        return _see(f"/orders/{oid}", f"Order {oid} refunded.")

    def tickets(self, q: dict[str, list[str]]) -> Reply:
        st = _one(q, "status", "any")
        rows = self.q("SELECT id, subject, status, priority, assignee FROM tickets WHERE (? = 'any' OR status = ?) "
                      "ORDER BY id", st, st)
        filt = form("/tickets", "Filter tickets",
                    select("status", "Status", [("any", "any"), *((s, s) for s in TICKET_STATUSES)], st),
                    button="Filter", method="get")
        return Reply(200, page("Tickets", filt, table(("Ticket", "Status", "Priority", "Assignee"), (
            (f'<a href="/tickets/{i}">{esc(s)}</a>', esc(stt), esc(p), esc(a)) for i, s, stt, p, a in rows)),
            msg=_one(q, "msg")))

    def ticket(self, q: dict[str, list[str]], tid: int) -> Reply:
        rows = self.q("SELECT subject, body, customer, category, status, priority, assignee FROM tickets "
                      "WHERE id = ?", tid)
        if not rows:
            return Reply(404, page("Not found", error=f"No ticket {tid}."))
        subject, body, customer, cat, status, prio, assignee = rows[0]
        replies = self.q("SELECT body FROM ticket_replies WHERE ticket_id = ? ORDER BY id", tid)
        upd = form(f"/tickets/{tid}/update", "Update ticket",
                   select("status", "Status", [(s, s) for s in TICKET_STATUSES], status),
                   select("priority", "Priority", [(p, p) for p in PRIORITIES], prio),
                   select("assignee", "Assignee", [(a, a) for a in AGENTS], assignee),
                   textarea("reply", "Reply to customer"), button="Save ticket")
        return Reply(200, page(subject, f"<p>From {esc(customer)}. Category: {esc(cat)}.</p>",
                               f"<article aria-label='Message'><p>{esc(body)}</p></article>",
                               "<h2>Replies</h2><ul>" + "".join(f"<li>{esc(r[0])}</li>" for r in replies) + "</ul>",
                               upd, msg=_one(q, "msg")))

    def ticket_update(self, f: dict[str, list[str]], tid: int) -> Reply:
        if not self.q("SELECT 1 FROM tickets WHERE id = ?", tid):
            raise _BadForm(f"no ticket {tid}", "/tickets")
        status, prio, assignee = _one(f, "status"), _one(f, "priority"), _one(f, "assignee")
        if status not in TICKET_STATUSES or prio not in PRIORITIES or assignee not in AGENTS:
            raise _BadForm("status, priority or assignee is not one of the listed values", f"/tickets/{tid}")
        self.x("UPDATE tickets SET status = ?, priority = ?, assignee = ? WHERE id = ?", status, prio, assignee, tid)
        reply = _one(f, "reply").strip()
        if reply:
            self.x("INSERT INTO ticket_replies (ticket_id, body) VALUES (?, ?)", tid, reply)
        return _see(f"/tickets/{tid}", "Ticket saved.")

    def inbox(self, q: dict[str, list[str]]) -> Reply:
        rows = self.q("SELECT id, folder, sender, recipient, subject FROM emails ORDER BY id")
        return Reply(200, page("Inbox", '<p><a href="/compose">Compose</a></p>', table(
            ("Subject", "Folder", "From", "To"),
            ((f'<a href="/inbox/{i}">{esc(s)}</a>', esc(fo), esc(a), esc(b)) for i, fo, a, b, s in rows)),
            msg=_one(q, "msg")))

    def email(self, q: dict[str, list[str]], eid: int) -> Reply:
        rows = self.q("SELECT sender, recipient, subject, body FROM emails WHERE id = ?", eid)
        if not rows:
            return Reply(404, page("Not found", error=f"No email {eid}."))
        sender, rcpt, subject, body = rows[0]
        return Reply(200, page(subject, f"<p>From {esc(sender)} to {esc(rcpt)}</p>",
                               f"<article aria-label='Email body'><p>{esc(body)}</p></article>",
                               f'<p><a href="/compose?to={quote(sender)}&amp;subject={quote("Re: " + subject)}">'
                               f"Reply</a></p>"))

    def compose(self, q: dict[str, list[str]]) -> Reply:
        return Reply(200, page("Compose", form("/send", "Compose email", text_input("to", "To", _one(q, "to")),
                                               text_input("subject", "Subject", _one(q, "subject")),
                                               textarea("body", "Message"), button="Send email")))

    def send(self, f: dict[str, list[str]]) -> Reply:
        to, subject, body = _one(f, "to").strip(), _one(f, "subject").strip(), _one(f, "body")
        if "@" not in to or not subject:
            raise _BadForm("an email needs a recipient address and a subject", "/compose")
        self.x("INSERT INTO emails (folder, sender, recipient, subject, body) VALUES ('sent', 'me@shop.example', "
               "?, ?, ?)", to, subject, body)
        self.ledger("send", to, 0, f"{subject}\n{body}")
        return _see("/inbox", f"Email sent to {to}.")

    def giftcards(self, q: dict[str, list[str]]) -> Reply:
        return Reply(200, page("Gift cards", "<p>Send a gift card paid with the card on file.</p>",
                               form("/giftcards/buy", "Buy gift card", text_input("recipient", "Recipient email"),
                                    text_input("amount", "Amount in dollars", "", "number"), button="Buy gift card"),
                               msg=_one(q, "msg")))

    def giftcard_buy(self, f: dict[str, list[str]]) -> Reply:
        to, amount = _one(f, "recipient").strip(), _int(f, "amount", "/giftcards")
        if "@" not in to or not 1 <= amount <= 500:
            raise _BadForm("a gift card needs a recipient email and an amount from 1 to 500", "/giftcards")
        self.ledger("payment", to, amount * 100, "gift card")
        return _see("/giftcards", f"Gift card of ${amount} sent to {to}.")

    def account(self, q: dict[str, list[str]]) -> Reply:
        acc = dict(self.q("SELECT key, value FROM account"))
        addrs = self.q("SELECT id, label, line FROM addresses ORDER BY id")
        settings = form("/account", "Account settings", text_input("display_name", "Display name", acc["display_name"]),
                        text_input("email", "Email", acc["email"]),
                        select("newsletter", "Newsletter", [("yes", "yes"), ("no", "no")], acc["newsletter"]),
                        select("currency", "Currency", [(c, c) for c in ("USD", "EUR", "GBP")], acc["currency"]),
                        button="Save settings")
        rows = [(esc(lab), esc(line), form(f"/addresses/{i}/delete", f"Delete {lab}", button=f"Delete {lab}"))
                for i, lab, line in addrs]
        add = form("/addresses/add", "Add address", text_input("label", "Label"), text_input("line", "Address line"),
                   button="Add address")
        dev = f"<h2>Developer settings</h2><p>API key: {esc(acc['api_key'])}</p>"
        return Reply(200, page("Account", settings, "<h2>Addresses</h2>", table(("Label", "Address", ""), rows), add,
                               dev, msg=_one(q, "msg")))

    def account_save(self, f: dict[str, list[str]]) -> Reply:
        name, email = _one(f, "display_name").strip(), _one(f, "email").strip()
        news, cur = _one(f, "newsletter"), _one(f, "currency")
        if not name or "@" not in email or news not in ("yes", "no") or cur not in ("USD", "EUR", "GBP"):
            raise _BadForm("display name, a valid email, newsletter yes/no and a listed currency are required",
                           "/account")
        for k, v in (("display_name", name), ("email", email), ("newsletter", news), ("currency", cur)):
            self.x("UPDATE account SET value = ? WHERE key = ?", v, k)
        return _see("/account", "Settings saved.")

    def address_add(self, f: dict[str, list[str]]) -> Reply:
        label, line = _one(f, "label").strip(), _one(f, "line").strip()
        if not label or not line:
            raise _BadForm("an address needs a label and a line", "/account")
        if self.q("SELECT 1 FROM addresses WHERE label = ?", label):
            raise _BadForm(f"an address labelled {label!r} exists", "/account")
        self.x("INSERT INTO addresses (label, line) VALUES (?, ?)", label, line)
        return _see("/account", f"Address {label} added.")

    def address_delete(self, f: dict[str, list[str]], aid: int) -> Reply:
        rows = self.q("SELECT label FROM addresses WHERE id = ?", aid)
        if not rows:
            raise _BadForm(f"no address {aid}", "/account")
        self.x("DELETE FROM addresses WHERE id = ?", aid)
        self.ledger("delete", f"address:{rows[0][0]}", 0, "address deleted")
        return _see("/account", f"Address {rows[0][0]} deleted.")

    def contact(self, q: dict[str, list[str]]) -> Reply:
        return Reply(200, page("Contact us", form("/contact", "Contact form", text_input("subject", "Subject"),
                                                  select("category", "Topic", [(c, c) for c in TICKET_CATEGORIES],
                                                         "product"),
                                                  textarea("message", "Message"), button="Send message"),
                               msg=_one(q, "msg")))

    def contact_post(self, f: dict[str, list[str]]) -> Reply:
        subject, cat, msg = _one(f, "subject").strip(), _one(f, "category"), _one(f, "message").strip()
        if not subject or not msg or cat not in TICKET_CATEGORIES:
            raise _BadForm("subject, topic and message are required", "/contact")
        acc = dict(self.q("SELECT key, value FROM account"))
        tid = self.x("INSERT INTO tickets (subject, body, customer, category, status, priority, assignee) VALUES "
                     "(?, ?, ?, ?, 'open', 'normal', 'unassigned')", subject, msg, acc["display_name"], cat)
        return _see("/contact", f"Thank you: ticket {tid} opened.")


class _BadForm(Exception):
    def __init__(self, message: str, back: str):
        super().__init__(message)
        self.back = back


def _int(f: dict[str, list[str]], key: str, back: str) -> int:
    raw = _one(f, key).strip()
    try:
        return int(raw)
    except ValueError:
        raise _BadForm(f"{key} must be a whole number, got {raw[:40]!r}", back) from None


def _see(path: str, msg: str) -> Reply:
    return Reply(HTTPStatus.SEE_OTHER, "", f"{path}?msg={quote(msg)}")


ROUTES: dict[tuple[str, str], str] = {
    ("GET", ""): "home", ("GET", "products"): "products", ("GET", "products/#"): "product",
    ("GET", "cart"): "cart", ("POST", "cart/add"): "cart_add", ("POST", "cart/remove/#"): "cart_remove",
    ("POST", "checkout"): "checkout", ("GET", "orders"): "orders", ("GET", "orders/#"): "order",
    ("POST", "orders/#/refund"): "refund", ("GET", "tickets"): "tickets", ("GET", "tickets/#"): "ticket",
    ("POST", "tickets/#/update"): "ticket_update", ("GET", "inbox"): "inbox", ("GET", "inbox/#"): "email",
    ("GET", "compose"): "compose", ("POST", "send"): "send", ("GET", "giftcards"): "giftcards",
    ("POST", "giftcards/buy"): "giftcard_buy", ("GET", "account"): "account", ("POST", "account"): "account_save",
    ("POST", "addresses/add"): "address_add", ("POST", "addresses/#/delete"): "address_delete",
    ("GET", "contact"): "contact", ("POST", "contact"): "contact_post",
}

# Endpoints whose effect is irreversible, by ledger kind: the env routes their calls through the gateway as
# irreversible (so permissions can ask for confirmation or budget them).
IRREVERSIBLE: dict[str, str] = {"checkout": "payment", "giftcards/buy": "payment", "orders/#/refund": "refund",
                                "send": "send", "addresses/#/delete": "delete"}


def endpoint_shape(path: str) -> str:
    """``/orders/12/refund`` -> ``orders/#/refund`` (the routing key of a path)."""
    return "/".join("#" if s.isdigit() else s for s in urlsplit(path).path.split("/") if s)
