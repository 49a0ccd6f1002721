/**
 * Refreshing a view at most once per gap: the first request runs at once; requests that come during the gap
 * (or while `busy()` says the last run is still loading) make one more run when it ends. A run reads the
 * newest state itself, so the states between are never shown. Must not depend on any view.
 */
export class Throttle {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private again = false;

  constructor(private readonly gapMs: () => number, private readonly run: () => void,
              private readonly busy: () => boolean = () => false) {}

  request(): void {
    if (this.timer !== undefined) {
      this.again = true;
      return;
    }
    this.run();
    this.timer = setTimeout(() => this.release(), this.gapMs());
  }

  dispose(): void {
    clearTimeout(this.timer);
  }

  private release(): void {
    if (this.busy()) {
      this.timer = setTimeout(() => this.release(), 50);
      return;
    }
    this.timer = undefined;
    if (this.again) {
      this.again = false;
      this.request();
    }
  }
}
