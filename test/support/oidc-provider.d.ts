// oidc-provider (a devDependency for the OIDC end-to-end test) ships no type declarations.
declare module 'oidc-provider' {
  const Provider: any;
  export default Provider;
}
