// Live refresh: every data-refresh-ms, fetch the live part of the page again and put it
// in place. If the page server does not answer, the part stays and is marked stale.
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const every = Number(live.dataset.refreshMs) || 3000;
  async function refresh() {
    try {
      const response = await fetch(live.dataset.src, { cache: "no-store" });
      if (!response.ok) throw new Error(String(response.status));
      live.innerHTML = await response.text();
      live.classList.remove("stale");
    } catch (error) {
      live.classList.add("stale");
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
