"""``onceonly demo``: the Friday-evening incident, a naive endpoint versus onceonly.

- :mod:`onceonly.demo.shop`: the shop's tables and its (fake, real-HTTP) mail provider;
- :mod:`onceonly.demo.naive`: the endpoint written the way most are;
- :mod:`onceonly.demo.protected`: the same shop behind onceonly;
- :mod:`onceonly.demo.proxy`: the proxy that answers 502 after the commit;
- :mod:`onceonly.demo.incident`: plays the evening against both and counts;
- :mod:`onceonly.demo.command`: the command and its table.
"""
