/* memledger's static calculator (see memledger/webcalc.py).
 *
 * Python prints the data into the page: the controls, each preset's symbol values, and the
 * ledger's rows part by part with their formulas (SymPy's JavaScript printer, over BigInt).
 * This script only reads inputs with the CLI's rules (memledger.units.parse_count: the same
 * limit, the same message), looks the rows up, evaluates them exactly and renders. It decides
 * nothing about which rows exist. It is loaded only on pages that hold a calculator
 * (_ext/memledger_site.py), and under Node it exports its functions for tests/test_webcalc.py.
 */
(function () {
  "use strict";

  /* Exact integer helpers that the printed formulas call (memledger.webcalc.BigIntPrinter). */
  var ml = {
    ceilDiv: function (a, b) {
      var q = a / b;
      return a % b !== 0n && (a > 0n) === (b > 0n) ? q + 1n : q;
    },
    floorDiv: function (a, b) {
      var q = a / b;
      return a % b !== 0n && (a > 0n) !== (b > 0n) ? q - 1n : q;
    },
    exactDiv: function (a, b) {
      if (a % b !== 0n) throw new Error("expected a whole number of bytes, got " + a + "/" + b);
      return a / b;
    },
    max: function () {
      return Array.prototype.reduce.call(arguments, function (x, y) { return y > x ? y : x; });
    },
    min: function () {
      return Array.prototype.reduce.call(arguments, function (x, y) { return y < x ? y : x; });
    }
  };

  function compiled(data) {
    if (!data.compiled) {
      data.compiled = data.rows.map(function (row) { return new Function("ml", "v", "return " + row[3] + ";"); });
    }
    return data.compiled;
  }

  /* Python's repr() of a string: the quotes and escapes of the CLI's messages. */
  var UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

  function pyRepr(text) {
    var quote = text.indexOf("'") >= 0 && text.indexOf('"') < 0 ? '"' : "'", out = quote;
    for (var ch of text) {
      var code = ch.codePointAt(0);
      if (ch === quote || ch === "\\") out += "\\" + ch;
      else if (ch === "\t") out += "\\t";
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (code < 0x20 || code === 0x7f) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code < 0x7f || !UNPRINTABLE.test(ch)) out += ch;
      else if (code <= 0xff) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code <= 0xffff) out += "\\u" + code.toString(16).padStart(4, "0");
      else out += "\\U" + code.toString(16).padStart(8, "0");
    }
    return out + quote;
  }

  /* str.format for the templates Python sends: {name} and {name!r}. */
  function fill(template, values) {
    return template.replace(/\{(\w+)(!r)?\}/g, function (whole, name, repr) {
      if (!(name in values)) return whole;
      return repr ? pyRepr(String(values[name])) : String(values[name]);
    });
  }

  /* A positive integer from text, as memledger.units.parse_count reads it ("7", "7e9", "2.0"),
   * up to data.limit; otherwise an Error with parse_count's message naming the field. */
  var NUMBER = /^([+-]?)(?:([0-9]+)\.?([0-9]*)|\.([0-9]+))(?:[eE]([+-]?[0-9]+))?$/;
  /* Python's str.strip(): the characters str.isspace() accepts (not quite JavaScript's trim()). */
  var SPACE = "[\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
  var STRIP = new RegExp("^" + SPACE + "+|" + SPACE + "+$", "g");

  function parseCount(text, field, data) {
    var raw = String(text).replace(STRIP, ""), limit = BigInt(data.limit);
    var refused = new Error(fill(data.count_error, {name: field, raw: raw}));
    var m = NUMBER.exec(raw);
    if (!m) throw refused;
    var fraction = m[2] !== undefined ? m[3] : m[4];
    var digits = ((m[2] || "") + fraction).replace(/^0+/, "");
    var scale = (m[5] ? parseInt(m[5], 10) : 0) - fraction.length;
    if (!digits || m[1] === "-") throw refused;                       // zero or negative
    var zeros = digits.length - digits.replace(/0+$/, "").length;
    digits = digits.slice(0, digits.length - zeros);
    scale += zeros;
    if (scale < 0) throw refused;                                      // not a whole number
    if (digits.length + scale > data.limit.length) throw refused;     // beyond the limit, without computing it
    var value = BigInt(digits) * 10n ** BigInt(scale);
    if (value > limit) throw refused;
    return value;
  }

  /* The ledger of one setup ({field: text}): rows with exact BigInt bytes, and totals per device. */
  function ledger(data, setup) {
    var formulas = compiled(data), v = {}, rows = [], totals = {};
    var preset = data.bindings[setup[data.bindings_field]];
    if (!preset) throw new Error("unknown " + data.bindings_field + " " + setup[data.bindings_field]);
    Object.keys(preset).forEach(function (name) { v[name] = BigInt(preset[name]); });
    data.symbols.forEach(function (s) { if (s[1] in setup) v[s[0]] = BigInt(setup[s[1]]); });
    data.parts.forEach(function (part) {
      var key = part.fields.map(function (f) { return setup[f]; }).join("|");
      if (!(key in part.rows)) throw new Error("no rows for " + part.fields.join(", ") + " = " + key);
      part.rows[key].forEach(function (i) {
        var row = data.rows[i];
        rows.push({name: row[0], group: row[1], device: row[2], bytes: formulas[i](ml, v)});
      });
    });
    data.devices.forEach(function (d) { totals[d[0]] = 0n; });
    rows.forEach(function (r) { totals[r.device] += r.bytes; });
    return {rows: rows, totals: totals};
  }

  function bitLength(n) { return n === 0n ? 0 : n.toString(2).length; }

  function group(digits) { return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  /* f"{n:,}" */
  function formatInt(n) { return group(n.toString()); }

  /* memledger.units.format_bytes without the unit: f"{float(Fraction(n, unit)):,.{digits}f}".
   * The quotient is rounded to the nearest double (ties to even) as Python's int division does,
   * then printed from that double's exact binary value, rounding half to even as Python does. */
  function formatUnit(n, unit, digits) {
    var k = Math.max(0, 64 - (bitLength(n) - bitLength(unit)));
    var scaled = n << BigInt(k), q = scaled / unit;
    if (scaled % unit !== 0n) q |= 1n;                // sticky bit: q has >= 62 bits, so rounding sees it
    var mantissa = BigInt(Number(q));                 // the double, times 2^k, exactly
    var t = mantissa * 10n ** BigInt(digits), i = t >> BigInt(k);
    if (k > 0) {
      var rest = t - (i << BigInt(k)), half = 1n << BigInt(k - 1);
      if (rest > half || (rest === half && (i & 1n))) i += 1n;
    }
    var s = i.toString().padStart(digits + 1, "0");
    return digits ? group(s.slice(0, s.length - digits)) + "." + s.slice(s.length - digits) : group(s);
  }

  function size(n, data) { return formatUnit(n, BigInt(data.unit[1]), data.digits) + " " + data.unit[0]; }

  function element(tag, text, className) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (className) e.className = className;
    return e;
  }

  /* The setup the form describes: {setup, errors}; each refused field is marked aria-invalid. */
  function read(form, data) {
    var setup = {}, errors = [];
    data.controls.forEach(function (c) {
      var input = form.elements[c.field], value = input.value;
      try {
        if (c.count) {
          value = parseCount(value, c.field, data).toString();
        } else if (!c.options.some(function (o) { return o[0] === value; })) {
          throw new Error(c.field + " must be one of " + c.options.map(function (o) { return o[0]; }).join(", ") +
                          ", got " + pyRepr(value));
        }
        setup[c.field] = value;
        input.removeAttribute("aria-invalid");
      } catch (error) {
        errors.push(error.message);
        input.setAttribute("aria-invalid", "true");
      }
    });
    return {setup: setup, errors: errors};
  }

  function view(data, setup) {
    var result = ledger(data, setup), out = document.createDocumentFragment();
    var gpu = BigInt(data.gpus[setup[data.gpu_field]]), used = result.totals[data.verdict_device];
    var verdict = element("p", undefined, "memledger-calculator-verdict"), fits = used <= gpu;
    verdict.appendChild(element("b", fits ? "fits" : "does not fit", fits ? "fits" : "does-not-fit"));
    verdict.appendChild(document.createTextNode(": " + size(used, data) + " per GPU against " + size(gpu, data) +
                                                data.verdict_clause));
    var table = element("table", undefined, "memledger"), head = table.createTHead().insertRow();
    var body = table.createTBody(), labels = {};
    data.devices.forEach(function (d) { labels[d[0]] = d[1]; });
    data.header.forEach(function (h) { head.appendChild(element("th", h)); });
    function line(cells, tag, className) {
      var tr = body.insertRow();
      if (className) tr.className = className;
      cells.forEach(function (c, i) { tr.appendChild(element(tag, c, i > 2 ? "number" : undefined)); });
    }
    result.rows.forEach(function (r) {
      line([r.name, r.group, labels[r.device], formatInt(r.bytes), size(r.bytes, data)], "td");
    });
    data.devices.forEach(function (d) {
      var n = result.totals[d[0]];
      if (n !== 0n || d[0] === data.verdict_device) line(["total on " + d[1], "", d[1], formatInt(n), size(n, data)], "th", "total");
    });
    out.appendChild(verdict);
    out.appendChild(table);
    return out;
  }

  function start(root) {
    var data = JSON.parse(root.querySelector("script.memledger-calculator-data").textContent);
    var form = root.querySelector("form"), out = root.querySelector(".memledger-calculator-out");
    function update() {
      var content, state = read(form, data);
      if (state.errors.length) {
        content = document.createDocumentFragment();
        state.errors.forEach(function (message) {
          var p = element("p", message, "memledger-calculator-error");
          p.setAttribute("role", "alert");
          content.appendChild(p);
        });
      } else {
        try {
          content = view(data, state.setup);
        } catch (error) {
          content = element("p", String(error.message), "memledger-calculator-error");
        }
      }
      out.replaceChildren(content);              // all at once: never half a table
    }
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    update();
  }

  if (typeof module === "object" && module.exports) {
    module.exports = {ml: ml, ledger: ledger, parseCount: parseCount, formatInt: formatInt, formatUnit: formatUnit,
                      pyRepr: pyRepr};
  } else {
    var begin = function () {
      Array.prototype.forEach.call(document.querySelectorAll(".memledger-calculator"), start);
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", begin);
    else begin();
  }
})();
