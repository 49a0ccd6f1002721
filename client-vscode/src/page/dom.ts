/**
 * The page's few DOM helpers: making elements, setting text and attributes only when they change, and
 * keyed lists (`Keyed`) that keep each child element for as long as its key is shown, so an update
 * touches only what changed and focus, text selection and open tooltips survive it. Runs in the webview.
 */
const SVG_NS = "http://www.w3.org/2000/svg";

export function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

export function svg(tag: string, attrs: Record<string, string | number>, parent?: Element): SVGElement {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  parent?.appendChild(e);
  return e;
}

export function button(label: string, onClick: () => void, primary = false, title?: string): HTMLButtonElement {
  const b = el("button", primary ? "primary" : "secondary", label);
  b.type = "button";
  b.addEventListener("click", onClick);
  if (title) {
    b.title = title;
  }
  return b;
}

export function setText(e: Element, text: string): void {
  if (e.textContent !== text) {
    e.textContent = text;
  }
}

export function setAttr(e: Element, name: string, value: string | undefined): void {
  if (value === undefined) {
    if (e.hasAttribute(name)) {
      e.removeAttribute(name);
    }
  } else if (e.getAttribute(name) !== value) {
    e.setAttribute(name, value);
  }
}

export function setClass(e: Element, name: string, on: boolean): void {
  if (e.classList.contains(name) !== on) {
    e.classList.toggle(name, on);
  }
}

/**
 * Children of one parent kept by key: `show(keys)` makes the element of a new key, calls `update` on
 * every shown one (which should write only what changed: setText, setAttr), removes the elements of keys
 * no longer shown, and moves elements only where the order changed. An element's own state (focus, the
 * text typed in it, a selection inside it) lasts as long as its key is shown.
 */
export class Keyed<T, E extends Element = HTMLElement> {
  readonly elements = new Map<string, E>();

  constructor(readonly parent: Element, private readonly make: (item: T, key: string) => E,
              private readonly update: (element: E, item: T) => void, private readonly anchor: Node | null = null) {}

  show(items: readonly T[], keyOf: (item: T) => string): void {
    const keys = items.map(keyOf);
    const wanted = new Set(keys);
    for (const [key, element] of this.elements) {
      if (!wanted.has(key)) {
        element.remove();
        this.elements.delete(key);
      }
    }
    let next: Node | null = this.firstChild();
    items.forEach((item, i) => {
      const key = keys[i] as string;
      let element = this.elements.get(key);
      if (element === undefined) {
        element = this.make(item, key);
        this.elements.set(key, element);
      }
      this.update(element, item);
      if (element === next) {
        next = next.nextSibling === this.anchor ? null : next.nextSibling;
      } else {
        this.parent.insertBefore(element, next ?? this.anchor);
      }
    });
  }

  private firstChild(): Node | null {
    const first = this.parent.firstChild;
    return first === this.anchor ? null : first;
  }
}

/** Run `change`, then give the focus back to the element that had it when the change moved it (a node
 * that went to another group keeps the keyboard's place). */
export function keepingFocus(change: () => void): void {
  const focused = document.activeElement;
  change();
  if (focused instanceof HTMLElement || focused instanceof SVGElement) {
    if (document.activeElement !== focused && focused.isConnected) {
      focused.focus({ preventScroll: true });
    }
  }
}
