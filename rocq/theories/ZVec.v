(** * Vectors of integers, for the rules checker.

    Like Vec.v: plain list definitions, each mapped by extraction to one numpy function of
    govern/oracle/_prims.py and tested against this definition. *)

From Coq Require Import List Arith Bool Lia ZArith.
From Govern Require Import Vec.
Import ListNotations.

Record zvec := ZVec { zl : list Z }.

Definition zlen (a : zvec) : nat := length (zl a).
Definition znth (a : zvec) (i : nat) : Z := nth i (zl a) 0%Z.

(** Every entry equal to z. *)
Definition zconst (n : nat) (z : Z) : zvec := ZVec (repeat z n).

(** The column of a variable: entry s is lo + (s / stride) mod size. *)
Definition zcol (n stride size : nat) (lo : Z) : zvec :=
  ZVec (map (fun s => (lo + Z.of_nat ((s / stride) mod size))%Z) (seq 0 n)).

Definition zmap2 (f : Z -> Z -> Z) (a b : zvec) : zvec :=
  ZVec (map (fun p : Z * Z => f (fst p) (snd p)) (combine (zl a) (zl b))).

Definition b2z (b : bool) : Z := if b then 1%Z else 0%Z.
Definition nz (z : Z) : bool := negb (Z.eqb z 0).

Definition zadd (a b : zvec) : zvec := zmap2 Z.add a b.
Definition zsub (a b : zvec) : zvec := zmap2 Z.sub a b.
Definition zmin (a b : zvec) : zvec := zmap2 Z.min a b.
Definition zmax (a b : zvec) : zvec := zmap2 Z.max a b.
Definition zeq (a b : zvec) : zvec := zmap2 (fun x y => b2z (Z.eqb x y)) a b.
Definition zlt (a b : zvec) : zvec := zmap2 (fun x y => b2z (Z.ltb x y)) a b.
Definition zle (a b : zvec) : zvec := zmap2 (fun x y => b2z (Z.leb x y)) a b.
Definition zand (a b : zvec) : zvec := zmap2 (fun x y => b2z (nz x && nz y)) a b.
Definition zor (a b : zvec) : zvec := zmap2 (fun x y => b2z (nz x || nz y)) a b.

Definition znot (a : zvec) : zvec := ZVec (map (fun x => b2z (negb (nz x))) (zl a)).
Definition zmulc (a : zvec) (c : Z) : zvec := ZVec (map (fun x => (x * c)%Z) (zl a)).

(** Elementwise [if c <> 0 then a else b], truncated to the shortest operand. *)
Definition zite (c a b : zvec) : zvec :=
  ZVec (map (fun p : Z * (Z * Z) => if nz (fst p) then fst (snd p) else snd (snd p))
            (combine (zl c) (combine (zl a) (zl b)))).

Definition znz (a : zvec) : mask := Mask (map nz (zl a)).
(** [lo <= a[i] < hi] *)
Definition zinrange (a : zvec) (lo hi : Z) : mask :=
  Mask (map (fun x => Z.leb lo x && Z.ltb x hi) (zl a)).
Definition ztonat (a : zvec) : vec := Vec (map Z.to_nat (zl a)).

Definition mand (a b : mask) : mask := Mask (map (fun p : bool * bool => fst p && snd p) (combine (ml a) (ml b))).
Definition mandn (a b : mask) : mask := Mask (map (fun p : bool * bool => fst p && negb (snd p)) (combine (ml a) (ml b))).

(** Fused for speed, each defined as the composition it stands for (the primitive test compares the
    mapped primitive with exactly this definition): one pass, no intermediate vectors. *)
Definition zaxpy (acc v col : zvec) (c : Z) : zvec := zadd acc (zmulc (zsub v col) c).
Definition zinand (ok : mask) (v : zvec) (lo hi : Z) : mask := mand ok (zinrange v lo hi).
Definition mnone (a b : mask) : bool := Nat.eqb (mcount (mandn a b)) 0.
Definition vseleq (m : mask) (a b row : vec) : bool := mall (veq (vselect m a b) row).

(** ** Facts *)

Lemma zlen_zconst n z : zlen (zconst n z) = n.
Proof. unfold zlen, zconst; simpl. apply repeat_length. Qed.

Lemma znth_zconst n z i : i < n -> znth (zconst n z) i = z.
Proof.
  unfold znth, zconst; simpl. revert i; induction n; intros i H; [lia|]. destruct i; simpl; auto. apply IHn. lia.
Qed.

Lemma zlen_zcol n stride size lo : zlen (zcol n stride size lo) = n.
Proof. unfold zlen, zcol; simpl. rewrite map_length. apply seq_length. Qed.

Lemma znth_zcol n stride size lo i : i < n -> znth (zcol n stride size lo) i = (lo + Z.of_nat ((i / stride) mod size))%Z.
Proof.
  intros H. unfold znth, zcol; simpl. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto).
  rewrite seq_nth by auto. reflexivity.
Qed.

Lemma zlen_zmap2 f a b : zlen a = zlen b -> zlen (zmap2 f a b) = zlen a.
Proof. unfold zlen, zmap2; simpl; intros. rewrite map_length, combine_length. lia. Qed.

Lemma znth_zmap2 f a b i : i < zlen a -> zlen a = zlen b -> znth (zmap2 f a b) i = f (znth a i) (znth b i).
Proof.
  unfold zlen, zmap2, znth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (0%Z, 0%Z)) by (rewrite combine_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma zlen_map1 (f : Z -> Z) a : length (map f (zl a)) = zlen a.
Proof. apply map_length. Qed.

Lemma znth_map1 (f : Z -> Z) a i : i < zlen a -> nth i (map f (zl a)) 0%Z = f (znth a i).
Proof. intros H. unfold znth. apply nth_map_lt. auto. Qed.

Lemma zlen_zite c a b : zlen c = zlen a -> zlen a = zlen b -> zlen (zite c a b) = zlen a.
Proof. unfold zlen, zite; simpl; intros. rewrite map_length, !combine_length. lia. Qed.

Lemma znth_zite c a b i : i < zlen c -> zlen c = zlen a -> zlen a = zlen b ->
  znth (zite c a b) i = if nz (znth c i) then znth a i else znth b i.
Proof.
  unfold zlen, zite, znth; simpl; intros H1 H2 H3.
  rewrite nth_map_lt with (d' := (0%Z, (0%Z, 0%Z))) by (rewrite !combine_length; lia).
  rewrite combine_nth' by (rewrite ?combine_length; lia). rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mlen_znz a : mlen (znz a) = zlen a.
Proof. apply map_length. Qed.
Lemma mnth_znz a i : i < zlen a -> mnth (znz a) i = nz (znth a i).
Proof. intros H. unfold mnth, znz, znth; simpl. apply nth_map_lt. auto. Qed.

Lemma mlen_zinrange a lo hi : mlen (zinrange a lo hi) = zlen a.
Proof. apply map_length. Qed.
Lemma mnth_zinrange a lo hi i : i < zlen a -> mnth (zinrange a lo hi) i = (Z.leb lo (znth a i) && Z.ltb (znth a i) hi).
Proof. intros H. unfold mnth, zinrange, znth; simpl. rewrite nth_map_lt with (d' := 0%Z); auto. Qed.

Lemma vlen_ztonat a : vlen (ztonat a) = zlen a.
Proof. apply map_length. Qed.
Lemma vnth_ztonat a i : i < zlen a -> vnth (ztonat a) i = Z.to_nat (znth a i).
Proof. intros H. unfold vnth, ztonat, znth; simpl. rewrite nth_map_lt with (d' := 0%Z); auto. Qed.

Lemma mlen_mand a b : mlen a = mlen b -> mlen (mand a b) = mlen a.
Proof. unfold mlen, mand; simpl; intros. rewrite map_length, combine_length. lia. Qed.
Lemma mnth_mand a b i : i < mlen a -> mlen a = mlen b -> mnth (mand a b) i = (mnth a i && mnth b i).
Proof.
  unfold mlen, mand, mnth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (false, false)) by (rewrite combine_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mlen_mandn a b : mlen a = mlen b -> mlen (mandn a b) = mlen a.
Proof. unfold mlen, mandn; simpl; intros. rewrite map_length, combine_length. lia. Qed.
Lemma mnth_mandn a b i : i < mlen a -> mlen a = mlen b -> mnth (mandn a b) i = (mnth a i && negb (mnth b i)).
Proof.
  unfold mlen, mandn, mnth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (false, false)) by (rewrite combine_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mcount_zero m : mcount m = 0 -> forall i, i < mlen m -> mnth m i = false.
Proof.
  unfold mcount, mlen, mnth. destruct m as [l]; simpl. induction l as [|b l IH]; simpl; intros H i Hi; [lia|].
  destruct b; simpl in H; [discriminate|]. destruct i; auto. apply IH; auto. lia.
Qed.

Lemma zlen_zmulc a c : zlen (zmulc a c) = zlen a.
Proof. apply map_length. Qed.
Lemma znth_zmulc a c i : i < zlen a -> znth (zmulc a c) i = (znth a i * c)%Z.
Proof. intros H. unfold znth, zmulc; simpl. rewrite nth_map_lt with (d' := 0%Z); auto. Qed.
Lemma zlen_znot a : zlen (znot a) = zlen a.
Proof. apply map_length. Qed.
Lemma znth_znot a i : i < zlen a -> znth (znot a) i = b2z (negb (nz (znth a i))).
Proof. intros H. unfold znth, znot; simpl. rewrite nth_map_lt with (d' := 0%Z); auto. Qed.
