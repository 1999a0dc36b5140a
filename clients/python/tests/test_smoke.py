import snapfence


def test_smoke(url, key):
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w1", 30)
    assert g.lease.owner == "w1" and g.token >= 1
    w = c.put_snapshot(k, g.token, b"hello")
    assert w.version == 1
    s = c.get_snapshot(k)
    assert s.body == b"hello" and s.token == g.token and s.etag == w.etag
    st = c.get_lease(k)
    assert st.key == k and st.state == "held"
    c.release(k, g.token)
