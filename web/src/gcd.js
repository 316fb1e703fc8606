// Our stand-in for mathjs in the bundle (web/build.mjs resolves 'mathjs' here).
// Perses's core builds one function of it, gcd (the common step of a panel's
// queries, in milliseconds); mathjs's module entry brought 560 KiB of the 3.8 MB
// bundle and its setup at every page load. Anything else asked of mathjs fails
// the build (no such export), so a newer Perses that needs more is noticed.
export const gcdDependencies = { gcd: true };

function integer(value) {
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new TypeError(`gcd: ${value} is not an integer`);
  }
  return Math.abs(value);
}

// The greatest common divisor of integers (Euclid), as mathjs's gcd of numbers:
// never negative, gcd(0, n) = |n|, a non-integer refused.
export function gcd(...values) {
  if (values.length === 0) throw new TypeError('gcd: no value');
  let result = integer(values[0]);
  for (const value of values.slice(1)) {
    let other = integer(value);
    while (other !== 0) [result, other] = [other, result % other];
  }
  return result;
}

export function create(dependencies) {
  for (const name of Object.keys(dependencies)) {
    if (name !== 'gcdDependencies') throw new Error(`mathjs stand-in: ${name} is not provided`);
  }
  return { gcd };
}
